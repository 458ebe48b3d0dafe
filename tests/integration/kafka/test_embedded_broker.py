"""What the embedded Tansu broker does with aborted transactions, as the README states it: it
hands ``read_committed`` readers the records of an aborted transaction that reached it
(Apache Kafka filters them), while records aborted before they were sent never reach it.
The consumers rely on the second: a batch's transaction opens only once Redis has answered."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Message, Producer

from streamrec.kafka.topics import TopicSpec, create_topics


def transactional(bootstrap_servers: str, unique_name: str, linger_ms: int) -> Producer:
    producer = Producer({
        "bootstrap.servers": bootstrap_servers, "transactional.id": f"t-{unique_name}-{linger_ms}",
        "linger.ms": linger_ms,
    })
    producer.init_transactions(30)
    return producer


def values(records: list[Message]) -> list[bytes]:
    return [r.value() or b"" for r in records]


def test_records_of_an_aborted_transaction_that_reached_the_broker_are_read_committed(
    bootstrap_servers: str, unique_name: str, topic_reader: Callable[[str], list[Message]],
) -> None:
    topic = f"aborted-{unique_name}"
    create_topics(bootstrap_servers, {topic: TopicSpec(1)})
    producer = transactional(bootstrap_servers, unique_name, linger_ms=0)
    producer.begin_transaction()
    producer.produce(topic, b"sent, then aborted")
    assert producer.flush(10) == 0  # on the broker
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)
    assert values(topic_reader(topic)) == [b"sent, then aborted", b"committed"]  # Kafka: [b"committed"]


def test_records_aborted_before_they_were_sent_never_reach_the_broker(
    bootstrap_servers: str, unique_name: str, topic_reader: Callable[[str], list[Message]],
) -> None:
    topic = f"unsent-{unique_name}"
    create_topics(bootstrap_servers, {topic: TopicSpec(1)})
    producer = transactional(bootstrap_servers, unique_name, linger_ms=30_000)
    producer.begin_transaction()
    producer.produce(topic, b"queued, then aborted")
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)
    assert values(topic_reader(topic)) == [b"committed"]
