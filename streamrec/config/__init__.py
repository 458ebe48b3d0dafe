"""One typed, frozen configuration, read from flags, ``STREAMREC_*`` env vars and ``streamrec.toml``.

Nested sections use ``__`` in env names: ``STREAMREC_KAFKA__BOOTSTRAP_SERVERS=host:9092``,
``STREAMREC_LEARNER__INTERVAL_S=120``. Kafka and Redis client options pass through as dicts
(``STREAMREC_KAFKA__CLIENT='{"security.protocol": "SSL"}'``). The feature store is picked by
``STREAMREC_STORE__TYPE`` (``redis``, the default, or ``memory``).
"""

from __future__ import annotations

from streamrec.config.consumer import ConsumerConfig
from streamrec.config.kafka import LIBRDKAFKA_PARTITIONERS, KafkaConfig, Partitioner
from streamrec.config.learner import LearnerConfig
from streamrec.config.loading import env_name, load_config
from streamrec.config.model import (
    BEHAVIOUR_FEATURES,
    BUILTIN_TABLE_FEATURES,
    MODEL_SETTINGS_BEFORE,
    MODEL_SETTINGS_INIT_ONLY,
    USER_FEATURE,
    Feature,
    ModelConfig,
    TableConfig,
)
from streamrec.config.services import ServicesConfig
from streamrec.config.serving import ServingConfig
from streamrec.config.settings import StreamrecConfig
from streamrec.config.store import MemoryStoreConfig, RedisStoreConfig, StoreConfig, redact_url

__all__ = [
    "BEHAVIOUR_FEATURES",
    "BUILTIN_TABLE_FEATURES",
    "LIBRDKAFKA_PARTITIONERS",
    "MODEL_SETTINGS_BEFORE",
    "MODEL_SETTINGS_INIT_ONLY",
    "USER_FEATURE",
    "ConsumerConfig",
    "Feature",
    "KafkaConfig",
    "LearnerConfig",
    "MemoryStoreConfig",
    "ModelConfig",
    "Partitioner",
    "RedisStoreConfig",
    "ServicesConfig",
    "ServingConfig",
    "StoreConfig",
    "StreamrecConfig",
    "TableConfig",
    "env_name",
    "load_config",
    "redact_url",
]
