"""What the embedded Tansu broker does with aborted transactions, as the README states it: it
hands ``read_committed`` readers the records of an aborted transaction that reached it
(Apache Kafka filters them), while records aborted before they were sent never reach it.
The consumers rely on the second: a batch's transaction opens only once Redis has answered.
"""

from __future__ import annotations

from confluent_kafka import Producer

from streamrec.kafka.topics import TopicSpec, create_topics
from tests.integration.conftest import read_committed


def abort_then_commit(bootstrap_servers: str, topic: str, *, sent: bool) -> list[bytes]:
    """One transaction aborted (its record sent to the broker first, or still queued), then
    one committed; what a ``read_committed`` reader reads of the topic.
    """
    create_topics(bootstrap_servers, {topic: TopicSpec(1)})
    producer = Producer({
        "bootstrap.servers": bootstrap_servers, "transactional.id": f"t-{topic}",
        "linger.ms": 0 if sent else 30_000,  # 30 s: queued until a flush or a commit
    })
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    if sent:
        assert producer.flush(10) == 0  # on the broker
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)
    return [r.value() or b"" for r in read_committed(bootstrap_servers, topic)]


def test_records_of_an_aborted_transaction_that_reached_the_broker_are_read_committed(
    bootstrap_servers: str, unique_name: str,
) -> None:
    read = abort_then_commit(bootstrap_servers, f"aborted-{unique_name}", sent=True)
    assert read == [b"aborted", b"committed"]  # Apache Kafka: [b"committed"]


def test_records_aborted_before_they_were_sent_never_reach_the_broker(
    bootstrap_servers: str, unique_name: str,
) -> None:
    assert abort_then_commit(bootstrap_servers, f"unsent-{unique_name}", sent=False) == [b"committed"]
