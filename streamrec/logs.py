"""Logging set-up for the CLI only: libraries just call ``logging.getLogger(__name__)``."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is at emit time (test runners swap it)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def configure(level: str = "INFO") -> None:
    """Attach one stderr handler to the ``streamrec`` logger (idempotent)."""
    logger = logging.getLogger("streamrec")
    logger.setLevel(level.upper())
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(_FORMAT))
        logger.addHandler(handler)
    logger.propagate = False
