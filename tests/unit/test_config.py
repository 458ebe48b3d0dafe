"""Configuration checks that guard a guarantee."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from streamrec.config import KafkaConfig


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
    but did not commit: the records between would be skipped."""
    with pytest.raises(ValidationError, match="eager rebalancing"):
        KafkaConfig(client=client)


def test_eager_rebalancing_options_pass() -> None:
    cfg = KafkaConfig(client={"partition.assignment.strategy": "roundrobin", "group.protocol": "classic"})
    assert cfg.client["partition.assignment.strategy"] == "roundrobin"
