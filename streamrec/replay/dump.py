"""The samples of a backtest as JSON lines.

To check what the strategies were scored on (outside references, other tools): one line per
sample, in order,
``{"micro_batch": <index>, "sample": <the samples topic's wire form>}``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from streamrec.errors import OutputError
from streamrec.replay.batches import MicroBatch


def dump_samples(batches: Sequence[MicroBatch], path: Path) -> None:
    """Write every sample of ``batches`` with its micro-batch index to ``path``, atomically.

    A reader sees the whole file or none (written beside it, then renamed).

    Raises:
        OutputError: the file could not be written.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("wb") as fh:
            for batch in batches:
                head = b'{"micro_batch":%d,"sample":' % batch.index
                fh.writelines(head + s.to_json() + b"}\n" for s in batch.samples)
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"the samples could not be written to {path}: {exc.strerror or exc}") from exc
