"""The services section: the embedded broker and Redis that ``streamrec up`` starts."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from streamrec.config.section import MAX_SECONDS, SECTION, NonEmptyPath


class ServicesConfig(BaseModel):
    """The embedded broker and Redis that ``streamrec up`` starts (env ``STREAMREC_SERVICES__*``)."""

    model_config = SECTION

    host: str = Field("127.0.0.1", description="STREAMREC_SERVICES__HOST")
    kafka_port: int = Field(9092, ge=1, le=65535, description="STREAMREC_SERVICES__KAFKA_PORT")
    redis_port: int = Field(6380, ge=1, le=65535, description="STREAMREC_SERVICES__REDIS_PORT")
    state_dir: NonEmptyPath = Field(
        Path(".streamrec"), description="STREAMREC_SERVICES__STATE_DIR (pids, addresses, logs)"
    )
    # None: Redis keeps nothing (development, tests). A directory: Redis keeps an append-only
    # file there and its data survives restarts. The embedded broker keeps nothing either way.
    data_dir: NonEmptyPath | None = Field(None, description="STREAMREC_SERVICES__DATA_DIR (Redis AOF)")
    start_timeout_s: float = Field(
        20.0, gt=0, le=MAX_SECONDS, description="STREAMREC_SERVICES__START_TIMEOUT_S"
    )
