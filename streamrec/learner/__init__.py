"""The micro-batch learner: the learner contract, the DIN model, the learner loop.

- `Learner` is the contract every model implements (``learn_many``, ``predict_many``);
  `DINLearner` is the Deep Interest Network in PaddlePaddle, `DeepFMLearner` DeepFM on the
  same tables (``STREAMREC_MODEL__LEARNER`` chooses). All take a
  `SampleColumns`: samples as columns.
- `LearnerRunner` is the loop: read a micro-batch of samples from Kafka, score it,
  train on it, write a snapshot to a `SnapshotStore`
  (`streamrec.snapshots`; re-exported here for older imports).
- `yield_checks` and `check_learner` check a learner against the contract (as
  river's ``checks``), `Promises` saying what it promises beyond it;
- `auc`, `gauc` and `logloss` are the prequential metrics;
  `fingerprint` is the stable id hash the embedding tables key rows by.

Names are imported when first used: Paddle loads only with `DINLearner` or `DeepFMLearner`.
"""

from __future__ import annotations

from streamrec.lazy import lazy_exports
from streamrec.paddlesignals import guard_paddle_import

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads either)
if TYPE_CHECKING:
    from streamrec.learner.base import Learner, TrainResult
    from streamrec.learner.checks import Check, Promises, check_learner, yield_checks
    from streamrec.learner.columns import SampleColumns
    from streamrec.learner.deepfm_learner import DeepFMLearner
    from streamrec.learner.din import DINLearner
    from streamrec.learner.hashing import fingerprint
    from streamrec.learner.metrics import auc, gauc, logloss
    from streamrec.learner.reports import LearnerStats, MicroBatchReport
    from streamrec.learner.runner import LearnerRunner
    from streamrec.snapshots.manifest import SnapshotManifest
    from streamrec.snapshots.pointer import ServingPointer
    from streamrec.snapshots.store import SnapshotStore

__all__ = [
    "SampleColumns",
    "Check",
    "DINLearner",
    "DeepFMLearner",
    "Learner",
    "LearnerRunner",
    "LearnerStats",
    "MicroBatchReport",
    "Promises",
    "ServingPointer",
    "SnapshotManifest",
    "SnapshotStore",
    "TrainResult",
    "auc",
    "check_learner",
    "fingerprint",
    "gauc",
    "logloss",
    "yield_checks",
]

# Its modules import Paddle: a program's signal handlers and root logger are kept through that import.
guard_paddle_import()

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "streamrec.learner.base": ["Learner", "TrainResult"],
        "streamrec.learner.columns": ["SampleColumns"],
        "streamrec.learner.checks": ["Check", "Promises", "check_learner", "yield_checks"],
        "streamrec.learner.deepfm_learner": ["DeepFMLearner"],
        "streamrec.learner.din": ["DINLearner"],
        "streamrec.learner.hashing": ["fingerprint"],
        "streamrec.learner.metrics": ["auc", "gauc", "logloss"],
        "streamrec.learner.reports": ["LearnerStats", "MicroBatchReport"],
        "streamrec.learner.runner": ["LearnerRunner"],
        # snapshots are their own package now (streamrec.snapshots): these names stay for older imports
        "streamrec.snapshots.manifest": ["SnapshotManifest"],
        "streamrec.snapshots.pointer": ["ServingPointer"],
        "streamrec.snapshots.store": ["SnapshotStore"],
    },
)

# The top-level ``learner/`` folder is a link to this package, so from the repository root the
# same files could also import as ``learner``: two copies of every class. One name only.
if __name__ != "streamrec.learner":
    raise ImportError(f"import streamrec.learner, not {__name__}: learner/ is a link into streamrec/")
