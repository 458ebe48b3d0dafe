"""Per-user behaviour sequences: the :class:`FeatureStore` interface and its implementations."""

from streamrec.config import MemoryStoreConfig, RedisStoreConfig
from streamrec.featurestore.base import Arrival, Behaviour, FeatureStore, History, StoreUpdate, Verdict
from streamrec.featurestore.memory import MemoryFeatureStore
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
]


def make_feature_store(
    cfg: RedisStoreConfig | MemoryStoreConfig, length: int, dedup_horizon_ms: int
) -> FeatureStore:
    """The store the configuration names, keeping each user's latest ``length`` behaviours
    and the event ids of ``dedup_horizon_ms`` of event time."""
    if isinstance(cfg, MemoryStoreConfig):
        return MemoryFeatureStore(length, dedup_horizon_ms)
    return RedisFeatureStore(cfg, length, dedup_horizon_ms)


# The top-level ``featurestore/`` folder is a link to this package, so from the repository root the
# same files could also import as ``featurestore``: two copies of every class. One name only.
if __name__ != "streamrec.featurestore":
    raise ImportError(
        f"import streamrec.featurestore, not {__name__}: featurestore/ is a link into streamrec/"
    )
