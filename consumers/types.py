"""The slice of a Kafka message that pure logic needs, so it runs without a live client."""

from __future__ import annotations

from typing import Protocol


class KafkaMessage(Protocol):
    """Structural type matching ``confluent_kafka.Message``."""

    def topic(self) -> str | None: ...  # noqa: D102

    def partition(self) -> int | None: ...  # noqa: D102

    def offset(self) -> int | None: ...  # noqa: D102

    def key(self) -> bytes | None: ...  # noqa: D102

    def value(self) -> bytes | None: ...  # noqa: D102
