"""Topics are created with the configured partitions, replication and retention."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from streamrec.config import KafkaConfig
from streamrec.kafka.topics import create_topics, ensure_topics


def test_every_topic_gets_its_partitions_and_retention(bootstrap_servers: str, unique_name: str) -> None:
    """Once: broker defaults only, and one partition for the dead-letter topic."""
    cfg = KafkaConfig(
        bootstrap_servers=bootstrap_servers, partitions=3,
        events_topic=f"e-{unique_name}", dlq_topic=f"d-{unique_name}",
        samples_topic=f"s-{unique_name}", samples_dlq_topic=f"sd-{unique_name}",
        samples_retention_ms=3_600_000, topic_config={"min.insync.replicas": "1"},
    )
    ensure_topics(cfg)
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    topics = admin.list_topics(timeout=10).topics
    expected = {
        cfg.events_topic: str(cfg.events_retention_ms),
        cfg.dlq_topic: str(cfg.dead_letter_retention_ms),
        cfg.samples_topic: "3600000",
        cfg.samples_dlq_topic: str(cfg.dead_letter_retention_ms),
    }
    for topic, retention in expected.items():
        assert len(topics[topic].partitions) == 3, topic
        (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
        configs = future.result(timeout=10)
        assert configs["retention.ms"].value == retention, topic
        assert configs["min.insync.replicas"].value == "1", topic
    ensure_topics(cfg)  # again: idempotent


def test_the_log_says_which_topics_were_created_and_which_were_there(
    bootstrap_servers: str, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by a tour: every `consumers run`, `learner run` and `produce` logged
    # `topics=<all four> created` though they existed already, where the docs say existing topics
    # are left as they are (and a topic created again is what SamplesTopicRecreated is about).
    there, new = f"t1-{unique_name}", f"t2-{unique_name}"
    create_topics(bootstrap_servers, {there: 1})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="streamrec.kafka.topics"):
        create_topics(bootstrap_servers, {there: 1, new: 1})
    (line,) = [r.getMessage() for r in caplog.records if r.name == "streamrec.kafka.topics"]
    assert f"created={new}" in line and f"existing={there}" in line, line
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="streamrec.kafka.topics"):
        create_topics(bootstrap_servers, {there: 1, new: 1})
    (line,) = [r.getMessage() for r in caplog.records if r.name == "streamrec.kafka.topics"]
    assert "created" not in line and f"existing={there},{new}" in line, line
