"""The feature store section: Redis (the default) or in-memory, picked by ``type``."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Discriminator, Field, Tag, field_validator

from streamrec.config.section import MAX_SECONDS, SECTION


class RedisStoreConfig(BaseModel):
    """The Redis feature store, the default (env ``STREAMREC_STORE__*``)."""

    model_config = SECTION

    type: Literal["redis"] = Field("redis", description="STREAMREC_STORE__TYPE")
    # 6380, not 6379, so the embedded Redis never collides with a system one.
    url: str = Field("redis://127.0.0.1:6380/0", description="STREAMREC_STORE__URL")
    cluster: bool = Field(False, description="STREAMREC_STORE__CLUSTER: url names a Cluster node")
    key_prefix: str = Field("sr", description="STREAMREC_STORE__KEY_PREFIX")
    # Users idle for 30 days lose their sequence: bounds memory on a long-running store. The
    # TTL is set on a user's first event and refreshed each time the user's event time enters
    # a new quarter of it (not at every batch: each refresh is a Redis command per key), so an
    # active user's keys expire 3/4 to 1 TTL after their last event.
    ttl_s: int = Field(30 * 86400, ge=1, le=MAX_SECONDS, description="STREAMREC_STORE__TTL_S")
    client: dict[str, Any] = Field(
        default_factory=dict, description="STREAMREC_STORE__CLIENT: extra redis-py options"
    )
    # A Redis that never answered since the process started is a wrong URL or a Redis not
    # started, not an outage: the consumers say so after this long instead of waiting out
    # STREAMREC_CONSUMER__RETRY_DEADLINE_S. 5 s is ample for a connection across a data centre.
    connect_timeout_s: float = Field(
        5.0, gt=0, le=MAX_SECONDS, description="STREAMREC_STORE__CONNECT_TIMEOUT_S"
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if urlsplit(url).scheme not in _REDIS_SCHEMES:
            raise ValueError(
                f"the Redis URL {redact_url(url)!r} must start with redis://, rediss:// or unix:// "
                "(STREAMREC_STORE__URL, or --redis-url)"
            )
        return url


# The schemes redis-py's from_url takes.
_REDIS_SCHEMES = ("redis", "rediss", "unix")


def redact_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: fit for an error message."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return parts._replace(netloc=user + parts.netloc.rpartition("@")[2]).geturl()


class MemoryStoreConfig(BaseModel):
    """The in-process store (``STREAMREC_STORE__TYPE=memory``).

    Nothing is shared or kept, so it suits one-process runs, backtests and tests only.
    """

    model_config = SECTION

    type: Literal["memory"] = Field("memory", description="STREAMREC_STORE__TYPE")


def _store_type(value: Any) -> str:
    """The store a section names; ``redis`` when it names none (env vars may set only a URL)."""
    if isinstance(value, dict):
        return str(value.get("type", "redis"))
    return str(getattr(value, "type", "redis"))


# The store each ``type`` names.
STORE_TYPES: dict[str, type[BaseModel]] = {"redis": RedisStoreConfig, "memory": MemoryStoreConfig}

# Chosen by its ``type`` field, as feast picks an online store.
StoreConfig = Annotated[
    Annotated[RedisStoreConfig, Tag("redis")] | Annotated[MemoryStoreConfig, Tag("memory")],
    Discriminator(_store_type),
]
