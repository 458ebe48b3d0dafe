"""Per-user behaviour sequences: the :class:`FeatureStore` protocol and its implementations."""

from streamrec.featurestore.base import Behaviour, FeatureStore, StoreUpdate
from streamrec.featurestore.memory import MemoryFeatureStore
from streamrec.featurestore.redis_store import RedisFeatureStore

__all__ = ["Behaviour", "FeatureStore", "StoreUpdate", "MemoryFeatureStore", "RedisFeatureStore"]
