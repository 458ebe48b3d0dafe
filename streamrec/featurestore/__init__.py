"""Per-user behaviour sequences: the :class:`FeatureStore` interface and its implementations."""

from streamrec.config import MemoryStoreConfig, RedisStoreConfig
from streamrec.featurestore.base import Behaviour, FeatureStore, StoreUpdate
from streamrec.featurestore.memory import MemoryFeatureStore
from streamrec.featurestore.redis_store import RedisFeatureStore

__all__ = [
    "Behaviour",
    "FeatureStore",
    "MemoryFeatureStore",
    "RedisFeatureStore",
    "StoreUpdate",
    "make_feature_store",
]


def make_feature_store(cfg: RedisStoreConfig | MemoryStoreConfig, length: int) -> FeatureStore:
    """The store the configuration names, keeping each user's latest ``length`` behaviours."""
    if isinstance(cfg, MemoryStoreConfig):
        return MemoryFeatureStore(length)
    return RedisFeatureStore(cfg, length)


# The top-level ``featurestore/`` folder is a link to this package, so from the repository root the
# same files could also import as ``featurestore``: two copies of every class. One name only.
if __name__ != "streamrec.featurestore":
    raise ImportError(
        f"import streamrec.featurestore, not {__name__}: featurestore/ is a link into streamrec/"
    )
