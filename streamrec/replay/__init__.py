"""Replay and backtesting: recorded events through the consumers' logic and the learners.

In process, with no broker and no Redis, to compare update strategies on exactly the same
samples (``streamrec replay``). `streamrec.replay.backtest.backtest` runs every strategy a
`BacktestConfig` names and returns the report (the function is not re-exported here: it
would hide its module of the same name). `build_samples` and `MicroBatch` are its
steps, and `PopularityLearner`, `ItemRateLearner` and `FeaturesLearner` the
baselines every model must beat.
"""

from __future__ import annotations

from streamrec.lazy import lazy_exports

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads either)
if TYPE_CHECKING:
    from streamrec.replay.backtest import BacktestConfig
    from streamrec.replay.baselines import ItemRateLearner, PopularityLearner
    from streamrec.replay.batches import MicroBatch, build_samples
    from streamrec.replay.features import FeaturesLearner

__all__ = [
    "BacktestConfig",
    "FeaturesLearner",
    "ItemRateLearner",
    "MicroBatch",
    "PopularityLearner",
    "build_samples",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "streamrec.replay.backtest": ["BacktestConfig"],
        "streamrec.replay.baselines": ["ItemRateLearner", "PopularityLearner"],
        "streamrec.replay.batches": ["MicroBatch", "build_samples"],
        "streamrec.replay.features": ["FeaturesLearner"],
    },
)
