"""What earlier micro-batches said about each id: the statistics a counter would use.

Per row of each behaviour table (the item's, the category's) and per user, the samples and
positives the learner has trained on. The model reads them as dense inputs: the target's
smoothed positive rate (log-odds) and log count, and the user's rate centred on the global
one. A counter of item rates beats a DIN that must learn each item's quality through its
embedding from a few samples; with these inputs the DIN starts where the counter is and
learns what it adds. They are state of the model: snapshotted with it, and serving reads them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from streamrec.config import BEHAVIOUR_FEATURES, ModelConfig
from streamrec.learner.hashing import bucketize

# The Beta prior's weight in pseudo-samples, as the item-rate baseline's: an id needs about
# this many samples before its own rate outweighs the global one.
PRIOR_SAMPLES = 10.0
# Users are counted in hashed buckets: bounded memory (8 MB) for any number of users, and at
# a million active users a bucket is shared by one other user in three; the counts blur a
# little, the ranking within a user (GAUC) not at all.
USER_BUCKETS = 2**20
USER = "user"
# Rates are clipped away from 0 and 1 before the log-odds: finite inputs for any counts.
RATE_EPS = 1e-4


class IdStats:
    """Samples and positives per table row and per user bucket (float32 arrays)."""

    def __init__(self, cfg: ModelConfig, rows: Mapping[str, int]) -> None:
        """Zero counts for the behaviour tables of ``cfg``, ``rows`` each, and the users."""
        sizes = {t.name: rows[t.name] for t in cfg.tables if t.feature in BEHAVIOUR_FEATURES}
        sizes[USER] = USER_BUCKETS
        self.samples = {name: np.zeros(n, np.float32) for name, n in sizes.items()}
        self.positives = {name: np.zeros(n, np.float32) for name, n in sizes.items()}

    @property
    def width(self) -> int:
        """Dense features per sample: rate and count per table, then the user's two."""
        return 2 * len(self.samples)

    def features(self, targets: Mapping[str, np.ndarray], users: np.ndarray) -> np.ndarray:
        """float32 [B, width].

        Per behaviour table (in ``targets``' order) the target row's smoothed rate log-odds and
        log1p(samples), then the user's centred rate log-odds and log1p(samples).
        """
        prior = self._global_rate()
        columns = []
        for name, rows in targets.items():
            columns += self._rate_and_count(name, rows, prior)
        rate, count = self._rate_and_count(USER, self.user_rows(users), prior)
        columns += [rate - log_odds(np.float64(prior)), count]
        return np.stack(columns, axis=1).astype(np.float32)

    def count(self, targets: Mapping[str, np.ndarray], users: np.ndarray, labels: np.ndarray) -> None:
        """Add a trained micro-batch's targets, users and labels."""
        self.count_rows(targets, self.user_rows(users), labels)

    def count_rows(self, targets: Mapping[str, np.ndarray], users: np.ndarray, labels: np.ndarray) -> None:
        """`count` with the users already as their buckets (`user_rows`)."""
        for name, rows in [*targets.items(), (USER, users)]:
            np.add.at(self.samples[name], rows, 1.0)
            np.add.at(self.positives[name], rows, labels)

    def reset(self, name: str, rows: np.ndarray) -> None:
        """Forget the counts of rows given to other ids."""
        self.samples[name][rows] = 0.0
        self.positives[name][rows] = 0.0

    def state_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The counts, keyed ``<prefix><table>/samples`` and ``.../positives``."""
        out = {}
        for name in self.samples:
            out[f"{prefix}{name}/samples"] = self.samples[name].copy()
            out[f"{prefix}{name}/positives"] = self.positives[name].copy()
        return out

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray], prefix: str) -> None:
        """Restore what `state_arrays` returned (shapes checked by the caller)."""
        for name in self.samples:
            self.samples[name] = np.asarray(arrays[f"{prefix}{name}/samples"], np.float32).copy()
            self.positives[name] = np.asarray(arrays[f"{prefix}{name}/positives"], np.float32).copy()

    def _global_rate(self) -> float:
        total = float(self.samples[USER].sum())
        return float(self.positives[USER].sum()) / total if total else 0.5

    def _rate_and_count(self, name: str, rows: np.ndarray, prior: float) -> list[np.ndarray]:
        n, pos = self.samples[name][rows], self.positives[name][rows]
        return [log_odds((pos + PRIOR_SAMPLES * prior) / (n + PRIOR_SAMPLES)), np.log1p(n)]

    @staticmethod
    def user_rows(users: np.ndarray) -> np.ndarray:
        """The users' buckets, int64 [B]."""
        return bucketize(users.tolist(), USER_BUCKETS)


def log_odds(rate: np.ndarray | np.floating) -> np.ndarray:
    """The log-odds ``log(p / (1 - p))`` of rates, clipped to ``[RATE_EPS, 1 - RATE_EPS]`` first.

    Examples:
        >>> log_odds(np.array([0.5, 0.9, 0.0])).round(2)
        array([ 0.  ,  2.2 , -9.21])
    """
    clipped = np.clip(rate, RATE_EPS, 1 - RATE_EPS)
    return np.asarray(np.log(clipped / (1 - clipped)))
