"""Per-user behaviour sequences: the `FeatureStore` interface and its implementations.

`RedisFeatureStore` is the production store; `MemoryFeatureStore` keeps the same
contract in process, for backtests and tests. `make_feature_store` builds the one the
settings name.
"""

from __future__ import annotations

from streamrec.lazy import lazy_exports

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads either)
if TYPE_CHECKING:
    from streamrec.config import StreamrecConfig
    from streamrec.featurestore.base import Arrival, Behaviour, FeatureStore, History, StoreUpdate, Verdict
    from streamrec.featurestore.memory import MemoryFeatureStore
    from streamrec.featurestore.profiles import ProfileStore
    from streamrec.featurestore.redis_store import RedisFeatureStore

__all__ = [
    "Arrival",
    "Behaviour",
    "FeatureStore",
    "History",
    "MemoryFeatureStore",
    "RedisFeatureStore",
    "StoreUpdate",
    "Verdict",
    "make_feature_store",
    "make_profile_store",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "streamrec.featurestore.base": [
            "Arrival",
            "Behaviour",
            "FeatureStore",
            "History",
            "StoreUpdate",
            "Verdict",
        ],
        "streamrec.featurestore.memory": ["MemoryFeatureStore"],
        "streamrec.featurestore.redis_store": ["RedisFeatureStore"],
    },
)


def make_feature_store(cfg: StreamrecConfig) -> FeatureStore:
    """The feature store the settings name.

    The store ``cfg.store`` names, keeping each user's latest ``model.sequence_length``
    behaviours, with their values of the declared behaviour features (``STREAMREC_FEATURES``),
    and the event ids of ``consumer.dedup_horizon_ms`` of event time.
    """
    from streamrec.config import MemoryStoreConfig
    from streamrec.featurestore.memory import MemoryFeatureStore
    from streamrec.featurestore.redis_store import RedisFeatureStore

    length, horizon_ms = cfg.model.sequence_length, cfg.consumer.dedup_horizon_ms
    schema = cfg.feature_schema()  # its behaviour features are stored with each behaviour
    if isinstance(cfg.store, MemoryStoreConfig):
        return MemoryFeatureStore(length, horizon_ms, schema)
    return RedisFeatureStore(cfg.store, length, horizon_ms, schema=schema)


def make_profile_store(cfg: StreamrecConfig) -> ProfileStore:
    """The profile store beside the feature store ``cfg.store`` names, keeping ``consumer.profile_points``."""
    from streamrec.config import MemoryStoreConfig
    from streamrec.featurestore.profiles import MemoryProfileStore
    from streamrec.featurestore.redis_profiles import RedisProfileStore

    points = cfg.consumer.profile_points
    if isinstance(cfg.store, MemoryStoreConfig):
        return MemoryProfileStore(points)
    return RedisProfileStore(cfg.store, points)


# The top-level ``featurestore/`` folder is a link to this package, so from the repository root the
# same files could also import as ``featurestore``: two copies of every class. One name only.
if __name__ != "streamrec.featurestore":
    raise ImportError(
        f"import streamrec.featurestore, not {__name__}: featurestore/ is a link into streamrec/"
    )
