"""A learner rank for the multi-rank tests: ``python tests/ranked_learner.py CONFIG.json [counting]``,
alone (one rank) or under ``python -m paddle.distributed.launch`` (several).

``counting`` trains a DIN that also counts, in its own state (so a snapshot holds the counts
and a restore rolls them back with the weights), how often the group trained each sample id ``s<n>``
(every rank's, exchanged): the exactly-once tests read them from the last snapshot.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

COUNTS_KEY = "state/trained_counts"
MAX_SAMPLES = 8192


def counting_learner(cfg: Any) -> Any:
    from streamrec.learner.din import DINLearner

    class CountingLearner(DINLearner):
        def __init__(self, cfg: Any) -> None:
            super().__init__(cfg)
            self.counts = np.zeros(MAX_SAMPLES, np.int64)

        def learn_share(self, batch: Any, layout: Any) -> Any:
            # every rank's sample ids (each rank holds only its own): counted alike on every rank
            ids = np.array([int(sid[1:]) for sid in batch.sample_ids], np.int64)
            np.add.at(self.counts, self._exchange({"ids": ids}, "counting")["ids"], 1)
            return super().learn_share(batch, layout)

        def state_arrays(self) -> dict[str, np.ndarray]:
            return {**super().state_arrays(), COUNTS_KEY: self.counts.copy()}

        def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
            arrays = dict(arrays)
            self.counts = np.asarray(arrays.pop(COUNTS_KEY)).copy()
            super().load_state_arrays(arrays)

    return CountingLearner(cfg)


def main(config_file: str, kind: str = "din") -> None:
    from streamrec.config import StreamrecConfig
    from streamrec.learner.ranked import RankedRunner
    from streamrec.learner.ranks import RankGroup, launched_world
    from streamrec.learner.registry import make_learner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = StreamrecConfig.model_validate_json(Path(config_file).read_text())
    learner: Any = (
        counting_learner(cfg.model) if kind == "counting" else make_learner(cfg.model, cfg.feature_schema())
    )
    rank, world = launched_world()
    group = RankGroup(rank, world, cfg.learner.rank_timeout_s)
    with RankedRunner(cfg, learner, group) as runner:
        stats = runner.run()
    print(
        f"rank {rank} trained {stats.micro_batches} micro-batches, {stats.samples_trained} samples",
        flush=True,
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
