"""A micro-batch's prequential scores as columns: what its report and the promotion gate read.

Several learner ranks each score only their own samples. To report and gate the group's
micro-batch as one process would, they all-gather these columns as fixed records
(`RECORD`, 40 bytes a sample: no features, no ids but the user's fingerprint), together with
each rank's training loss and sample count (`gather_scores`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns
from streamrec.learner.hashing import fingerprint
from streamrec.learner.match import match_features
from streamrec.learner.metrics import TELLS

#: `streamrec.learner.ranks.RankShare.exchange`: every rank's arrays, by name, in rank order.
Exchange = Callable[[Mapping[str, np.ndarray], str], dict[str, np.ndarray]]

_FIELDS = [
    ("user", np.uint64),  # the user id's fingerprint: GAUC groups by it
    ("ts", np.int64),
    ("prob", np.float32),
    ("served", np.float32),
    *((feature, np.float32) for feature in TELLS.values()),
    ("label", np.uint8),  # labels are 0 or 1 (`SampleColumns.from_samples` refuses others)
    ("known", np.bool_),
]
#: One sample's record, packed, padded to whole 8-byte words (what `RankShare.exchange` takes).
RECORD = np.dtype(
    {
        "names": [name for name, _ in _FIELDS],
        "formats": [kind for _, kind in _FIELDS],
        "offsets": list(np.cumsum([0, *(np.dtype(kind).itemsize for _, kind in _FIELDS[:-1])])),
        "itemsize": -(-sum(np.dtype(kind).itemsize for _, kind in _FIELDS) // 8) * 8,
    }
)


@dataclass(frozen=True, eq=False)
class Scored:
    """One micro-batch's scores, given before training on it, and what judging them needs. B: samples.

    Attributes:
        label: float32 [B] 1.0 for a positive, 0.0 for a negative.
        probs: [B] the learner's scores.
        users: [B] user ids (str), or their fingerprints (uint64) once gathered: GAUC groups
            by either alike.
        known: bool [B] whether the learner had trained on each target item before.
        ts: int64 [B] event times, epoch ms.
        features: The tells' match features (`TELLS`), name -> [B].
        served: [B] the served version's scores where the promotion gate judges by them; NaN
            where it does not.
    """

    label: np.ndarray
    probs: np.ndarray
    users: np.ndarray
    known: np.ndarray
    ts: np.ndarray
    features: Mapping[str, np.ndarray]
    served: np.ndarray

    @classmethod
    def of(
        cls, batch: SampleColumns, probs: np.ndarray, known: np.ndarray, served: np.ndarray | None = None
    ) -> Scored:
        """``batch`` scored ``probs`` (and ``served`` by the served version, if judged)."""
        found = match_features(batch)
        return cls(
            label=batch.label,
            probs=np.asarray(probs),
            users=batch.user_ids,
            known=np.asarray(known, dtype=bool),
            ts=batch.ts,
            features={feature: found[feature] for feature in TELLS.values()},
            served=np.full(len(batch), np.nan) if served is None else np.asarray(served),
        )

    @classmethod
    def concat(cls, parts: Sequence[Scored]) -> Scored:
        """Several parts' scores as one micro-batch's, in order."""
        if len(parts) == 1:
            return parts[0]
        return cls(
            label=np.concatenate([s.label for s in parts]),
            probs=np.concatenate([s.probs for s in parts]),
            users=np.concatenate([s.users for s in parts]),
            known=np.concatenate([s.known for s in parts]),
            ts=np.concatenate([s.ts for s in parts]),
            features={f: np.concatenate([s.features[f] for s in parts]) for f in parts[0].features},
            served=np.concatenate([s.served for s in parts]),
        )

    def __len__(self) -> int:
        """The number of samples, B."""
        return len(self.label)

    def to_words(self) -> np.ndarray:
        """int64 [B * RECORD.itemsize / 8]: one `RECORD` a sample (scores narrowed to float32)."""
        records = np.zeros(len(self), RECORD)  # zeros: the padding bytes are the same everywhere
        users = self.users if self.users.dtype == np.uint64 else fingerprint(self.users.tolist())
        columns = {"user": users, "ts": self.ts, "prob": self.probs, "served": self.served, **self.features}
        for name, values in columns.items():
            records[name] = values
        records["label"] = self.label > 0.5
        records["known"] = self.known
        return records.view(np.int64)

    @classmethod
    def from_words(cls, words: np.ndarray) -> Scored:
        """What `to_words` made of one or several ranks' scores."""
        records = np.ascontiguousarray(words, dtype=np.int64).view(RECORD)
        return cls(
            label=records["label"].astype(np.float32),
            probs=records["prob"].copy(),
            users=records["user"].copy(),
            known=records["known"].copy(),
            ts=records["ts"].copy(),
            features={feature: records[feature].copy() for feature in TELLS.values()},
            served=records["served"].copy(),
        )


def totals(train: TrainResult, dead: int) -> np.ndarray:
    """float64 [4]: ``train``'s loss and penalty summed over its samples, the samples, ``dead``."""
    n = train.samples
    return np.array(
        [train.loss * n if n else 0.0, train.penalty * n if n else 0.0, n, dead], np.float64
    )


def gather_scores(
    exchange: Exchange, scored: Scored, train: TrainResult, dead: int
) -> tuple[Scored, TrainResult, int]:
    """Every rank's scores (in rank order), training figures and dead letters, in one collective.

    The loss and penalty are the means over every rank's trained samples (each rank's mean
    weighted by its samples), as one process training them all reports; the steps are the
    group's already (every rank takes each one).
    """
    out = exchange({"scored": scored.to_words(), "totals": totals(train, dead)}, "scores")
    loss_sum, penalty_sum, samples, dead_sum = out["totals"].reshape(-1, 4).sum(axis=0)
    group = replace(
        train,
        loss=loss_sum / samples if samples else math.nan,
        penalty=penalty_sum / samples if samples else 0.0,
        samples=int(samples),
    )
    return Scored.from_words(out["scored"]), group, int(dead_sum)
