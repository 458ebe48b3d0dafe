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


class Record:
    """A record held in memory that satisfies :class:`KafkaMessage`: for replays and backtests
    that feed recorded events to the consumers' logic without a broker."""

    __slots__ = ("_key", "_offset", "_partition", "_topic", "_value")

    def __init__(
        self,
        value: bytes | None,
        offset: int = 0,
        *,
        topic: str = "events",
        partition: int = 0,
        key: bytes | None = None,
    ) -> None:
        """A record at ``topic[partition]`` ``offset`` holding ``value``."""
        self._value, self._offset, self._topic = value, offset, topic
        self._partition, self._key = partition, key

    def topic(self) -> str:  # noqa: D102
        return self._topic

    def partition(self) -> int:  # noqa: D102
        return self._partition

    def offset(self) -> int:  # noqa: D102
        return self._offset

    def key(self) -> bytes | None:  # noqa: D102
        return self._key

    def value(self) -> bytes | None:  # noqa: D102
        return self._value
