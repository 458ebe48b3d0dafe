"""What a process sets before its training loop starts: one call for every command that trains.

`streamrec learner run` (and each of its ranks), `streamrec replay backtest`, the demo and the
learner benchmarks call `before_training_loop` once, right before their loop, so that none of
them drifts from the others (a benchmark that left one out measured another process). MKL's
code path is chosen apart and earlier (`streamrec.kernelsettings.prefer_vector_kernels`: before
the first matrix product).
"""

from __future__ import annotations

from streamrec.gcsettings import tune_for_batches
from streamrec.heapsettings import keep_freed_memory


def before_training_loop() -> None:
    """The GC tuned for batches (`tune_for_batches`), freed memory kept (`keep_freed_memory`)."""
    tune_for_batches()
    keep_freed_memory()
