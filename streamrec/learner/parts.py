"""A micro-batch trained in parts while it is gathered, and its one report at the close.

Every ``STREAMREC_LEARNER__PART_S`` the learner loop scores, then trains, the samples gathered
since the last part (`PartClock`), so at the micro-batch's close only the last part is left
to train. Everything else stays once per micro-batch, over all its parts: online EWC's
consolidation (`PartLearner.end_micro_batch`), the report (its metrics over every part's
scores, each given before training on that part: still prequential), the positions and the
snapshot. `MicroBatchParts` keeps what the parts did until then: where their records end (not
the records), their scores (`Scored`, not their samples) and their step results.

A part also ends at ``STREAMREC_LEARNER__MAX_PART_SAMPLES`` samples, so a backlog, which fills
a micro-batch in seconds, is decoded and trained a bounded part at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from streamrec.config import LearnerConfig
from streamrec.kafka.records import KafkaMessage, Partition, advance_ends
from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns
from streamrec.learner.reports import StepResult
from streamrec.learner.scored import Scored


@dataclass
class MicroBatchParts:
    """The trained parts of the micro-batch being gathered: where their records end, scores, steps.

    ``ends``: each partition's next offset past the records trained or dead-lettered.
    """

    ends: dict[Partition, int] = field(default_factory=dict)
    scored: list[Scored] = field(default_factory=list)  # each part's, taken from its own columns
    steps: list[StepResult] = field(default_factory=list)
    dead: int = 0
    open: bool = False  # a part went to `PartLearner.learn_part`: the learner awaits the close

    def add(
        self,
        records: Sequence[KafkaMessage],
        step: StepResult | None,
        dead: int,
        batch: SampleColumns | None = None,
    ) -> None:
        """Keep a part: where its records end, its step on ``batch`` (None without samples), its dead letters.

        The part's scores are taken now, from the columns it was trained on (the match
        features read their positions, found once by the encoding): the close then builds no
        columns of the whole micro-batch again.
        """
        scored = None
        if step is not None:
            if batch is None:
                raise ValueError("a part's step comes with the columns it was trained on")
            scored = Scored.of(batch, step.probs, step.known)
        self.add_scored(records, step, scored, dead)

    def add_scored(
        self, records: Sequence[KafkaMessage], step: StepResult | None, scored: Scored | None, dead: int
    ) -> None:
        """`add` a part scored already: a learner rank's, its scores and dead letters the group's."""
        advance_ends(self.ends, records)
        if step is not None and scored is not None:
            self.steps.append(step)
            self.scored.append(scored)
        self.dead += dead

    @property
    def begun(self) -> bool:
        """Whether a part has handled records: the micro-batch is then trained at its close."""
        return bool(self.ends)

    def merged(self) -> tuple[Scored, StepResult]:
        """The whole micro-batch's scores and step, for its report: the parts' in order."""
        steps = self.steps
        step = steps[0] if len(steps) == 1 else StepResult(
            np.concatenate([s.probs for s in steps]),
            np.concatenate([s.known for s in steps]),
            merge_results([s.train for s in steps], [len(s.probs) for s in steps]),
            sum(s.score_seconds for s in steps),
            sum(s.train_seconds for s in steps),
        )
        return Scored.concat(self.scored), step  # one part: its own, as it is


def part_cap(cfg: LearnerConfig) -> int:
    """The most samples a part holds: ``max_part_samples``, never below what would wait anyway.

    A part of fewer than ``min_batch_samples`` or ``min_eval_samples`` is not trained: it
    gathers on into the next.
    """
    return max(cfg.max_part_samples, cfg.min_batch_samples, cfg.min_eval_samples)


def merge_results(results: Sequence[TrainResult], sizes: Sequence[int]) -> TrainResult:
    """One `TrainResult` of parts of ``sizes`` samples: losses weighted by samples trained.

    A result that does not count its trained samples (``samples`` 0) weighs by its part's
    size; one whose steps were all skipped (NaN loss) by nothing. Id counts add up; the rows
    in use are the last part's.
    """
    if len(results) == 1:
        return results[0]
    weights = [
        (r, r.samples or n) for r, n in zip(results, sizes, strict=True) if not math.isnan(r.loss)
    ]
    total = sum(w for _, w in weights)
    return TrainResult(
        sum(r.loss * w for r, w in weights) / total if total else math.nan,
        sum(r.steps for r in results),
        sum(r.skipped_steps for r in results),
        sum(r.penalty * w for r, w in weights) / total if total else 0.0,
        ids_admitted=_add(r.ids_admitted for r in results),
        ids_evicted=_add(r.ids_evicted for r in results),
        ids_refused=_add(r.ids_refused for r in results),
        rows_in_use=results[-1].rows_in_use,
        samples=sum(r.samples for r in results),
    )


def _add(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Counts by table, added up."""
    out: dict[str, int] = {}
    for each in counts:
        for name, n in each.items():
            out[name] = out.get(name, 0) + n
    return out
