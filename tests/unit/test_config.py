"""Configuration checks that guard a guarantee."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import ValidationError

from streamrec.config import KafkaConfig
from streamrec.kafka.clients import producer_config


@pytest.mark.parametrize(
    "client",
    [
        {"partition.assignment.strategy": "cooperative-sticky"},
        {"partition.assignment.strategy": "range,cooperative-sticky"},
        {"group.protocol": "consumer"},
    ],
)
def test_incremental_rebalancing_is_refused(client: dict[str, str]) -> None:
    """It keeps a partition's position across a rebalance, and a consumer drops what it polled
    but did not commit: the records between would be skipped.
    """
    with pytest.raises(ValidationError, match="eager rebalancing"):
        KafkaConfig(client=client)


def test_eager_rebalancing_options_pass() -> None:
    cfg = KafkaConfig(client={"partition.assignment.strategy": "roundrobin", "group.protocol": "classic"})
    assert cfg.client["partition.assignment.strategy"] == "roundrobin"


@pytest.mark.parametrize(
    ("partitioner", "librdkafka"), [("murmur2", "murmur2_random"), ("crc32", "consistent_random")]
)
def test_streamrecs_producers_partition_by_the_partitioner_the_consumers_check(
    partitioner: Literal["murmur2", "crc32"], librdkafka: str
) -> None:
    assert producer_config(KafkaConfig(partitioner=partitioner))["partitioner"] == librdkafka
    assert "partitioner" not in producer_config(KafkaConfig(partitioner=None))  # librdkafka's own


def test_a_client_partitioner_other_than_the_one_checked_is_refused() -> None:
    """Every record these producers wrote would be dead-lettered by the consumers."""
    with pytest.raises(ValidationError, match="set STREAMREC_KAFKA__PARTITIONER instead"):
        KafkaConfig(client={"partitioner": "consistent_random"})
    KafkaConfig(client={"partitioner": "murmur2_random"})
    KafkaConfig(partitioner=None, client={"partitioner": "fnv1a_random"})  # unchecked: theirs
