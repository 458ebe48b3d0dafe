"""Choosing a consumer runner by name: ``native`` (the default, exactly-once) or ``faust``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from streamrec.config import StreamrecConfig
from streamrec.consumers.native_runner import BatchReport, ConsumerRunner
from streamrec.errors import ConfigError

if TYPE_CHECKING:  # faust-streaming is optional: imported only when the Faust runner is asked for
    from streamrec.consumers.faust_runner import FaustRunner

RUNNERS = ("native", "faust")


def make_runner(
    name: str, cfg: StreamrecConfig, on_batch: Callable[[BatchReport], None] | None = None
) -> ConsumerRunner | FaustRunner:
    """The runner ``name`` names.

    ``on_batch`` hears of every batch done. The Faust runner needs faust-streaming (``pip
    install 'streamrec[faust]'``).
    """
    if name == "native":
        return ConsumerRunner(cfg, on_batch=on_batch)
    if name != "faust":
        raise ConfigError(f"the consumer runner must be one of {', '.join(RUNNERS)}, not {name!r}")
    try:
        from streamrec.consumers.faust_runner import FaustRunner
    except ImportError as exc:
        raise ConfigError(
            f"the Faust runner needs faust-streaming: pip install 'streamrec[faust]' ({exc})"
        ) from exc
    return FaustRunner(cfg, on_batch=on_batch)
