"""A learner rank for the multi-rank tests: ``python tests/ranked_learner.py CONFIG.json [counting]
[REPORTS.jsonl]``, alone (one rank) or under ``python -m streamrec.launch`` (Paddle's launcher) (several).

With ``REPORTS.jsonl`` every rank gates promotion (`streamrec.serving.gate.Promoter`, per
``STREAMREC_LEARNER__PROMOTE``), and rank 0 writes each micro-batch's report and each
judgement of the gate there, one JSON object a line.

``counting`` trains a DIN that also counts, in its own state (so a snapshot holds the counts
and a restore rolls them back with the weights), how often the group trained each sample id ``s<n>``
(every rank's, exchanged): the exactly-once tests read them from the last snapshot.
"""

from __future__ import annotations

import dataclasses
import json
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


def recording_gate(store: Any, cfg: Any, out: Path) -> Any:
    """A `Promoter` that writes each of its judgements to ``out``."""
    from streamrec.serving.gate import Promoter

    class RecordingPromoter(Promoter):
        def on_judged(self, *args: Any) -> Any:
            judgement = super().on_judged(*args)
            if judgement is not None:
                write_line(out, {"judgement": dataclasses.asdict(judgement)})
            return judgement

    return RecordingPromoter(store, cfg)


def write_line(out: Path, value: dict[str, Any]) -> None:
    with out.open("a") as f:
        f.write(json.dumps(value) + "\n")


def main(config_file: str, kind: str = "din", reports: str = "") -> None:
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
    hooks: dict[str, Any] = {}
    if reports:
        from streamrec.snapshots.store import SnapshotStore

        out = Path(reports)
        store = SnapshotStore(cfg.learner.snapshot_dir)
        hooks["gate"] = gate = recording_gate(store, cfg.learner, out)
        if rank == 0:
            hooks["snapshots"] = store
            hooks["on_snapshot"] = gate.on_snapshot
            hooks["on_report"] = lambda r: write_line(
                out,
                {
                    "report": {
                        **dataclasses.asdict(r.metrics),
                        "index": r.index,
                        "loss": r.loss,
                        "dead": r.dead,
                        "steps": r.steps,
                        "first_ts": r.first_ts,
                        "last_ts": r.last_ts,
                        "event_ts": sorted(r.event_ts.tolist()),
                    }
                },
            )
    with group, RankedRunner(cfg, learner, group, **hooks) as runner:  # the group left as the run ends
        stats = runner.run()
    print(
        f"rank {rank} trained {stats.micro_batches} micro-batches, {stats.samples_trained} samples",
        flush=True,
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
