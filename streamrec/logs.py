"""Logging set-up for the CLI only: libraries just call ``logging.getLogger(__name__)``."""

from __future__ import annotations

import logging

_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"


def configure(level: str = "INFO") -> None:
    """Attach one stderr handler to the ``streamrec`` logger (idempotent)."""
    logger = logging.getLogger("streamrec")
    logger.setLevel(level.upper())
    if not any(getattr(h, "_streamrec", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler._streamrec = True  # type: ignore[attr-defined]  # marker for idempotence
        logger.addHandler(handler)
    logger.propagate = False
