"""The consumer rides out Redis and broker outages: it retries with backoff (abort, redo) up to
a deadline, and only then stops with one clear line. Each service here is the test's own.
"""

from __future__ import annotations

import re
import time

import pytest

from streamrec.config import KafkaConfig, RedisStoreConfig, StreamrecConfig
from streamrec.consumers.native_runner import ConsumerRunner, ConsumerStats
from streamrec.errors import FeatureStoreUnreachable, OutageError
from streamrec.events import Event
from streamrec.kafka.topics import ensure_topics
from streamrec.producer import publish
from streamrec.samples import Sample
from tests.integration.conftest import PrivateService, read_committed
from tests.support import in_thread, wait_for


def config(kafka: KafkaConfig, redis_url: str, unique: str, deadline_s: float = 120.0) -> StreamrecConfig:
    return StreamrecConfig.model_validate({
        "kafka": kafka,
        "store": RedisStoreConfig(url=redis_url, key_prefix=unique, client={"socket_timeout": 1.0}),
        "consumer": {
            "group_id": f"c-{unique}", "stop_when_idle_s": 3.0, "batch_size": 100,
            "retry_deadline_s": deadline_s,
        },
    })


def assert_exactly_once(kafka: KafkaConfig, events: list[Event]) -> None:
    records = read_committed(kafka.bootstrap_servers, kafka.samples_topic)
    samples = [Sample.from_json(m.value() or b"") for m in records]
    ids = [s.sample_id for s in samples]
    assert len(ids) == len(set(ids)), "a sample was emitted twice"
    assert {i for i in ids if "~n" not in i} == {e.event_id for e in events if e.action in ("pv", "click")}


def test_a_redis_pause_is_ridden_out(
    kafka_config: KafkaConfig, private_redis: PrivateService, unique_name: str, clicks: list[Event]
) -> None:
    events = clicks[:3000]
    cfg = config(kafka_config, f"redis://{private_redis.address}/0", unique_name)
    publish(events, kafka_config)
    runner = ConsumerRunner(cfg)
    thread, out = in_thread(runner.run)
    wait_for(lambda: runner.stats.batches >= 2)
    private_redis.pause()
    time.sleep(4)  # the outage itself: several socket timeouts long
    private_redis.resume()
    thread.join(120)
    assert isinstance(out[0], ConsumerStats), out
    assert out[0].events == len(events) and out[0].retries >= 1
    assert_exactly_once(kafka_config, events)


def test_a_redis_that_stays_down_ends_in_one_clear_error_after_the_deadline(
    kafka_config: KafkaConfig, private_redis: PrivateService, unique_name: str, clicks: list[Event]
) -> None:
    """Redis answered, then went away for good: the batch is retried until the deadline.

    A Redis that never answered since the start fails sooner: the test below.
    """
    cfg = config(kafka_config, f"redis://{private_redis.address}/0", unique_name, deadline_s=3.0)
    publish(clicks[:500], kafka_config)
    runner = ConsumerRunner(cfg)
    thread, out = in_thread(runner.run)
    wait_for(lambda: runner.stats.batches >= 1)
    private_redis.proc.stop()
    publish(clicks[500:1000], kafka_config)
    thread.join(120)
    assert isinstance(out[0], OutageError), out
    assert re.search(r"gave up after 3 s.*redis", str(out[0]))


def test_a_redis_that_never_answered_since_the_start_ends_at_the_connect_timeout(
    kafka_config: KafkaConfig, private_redis: PrivateService, unique_name: str, clicks: list[Event]
) -> None:
    """Not an outage but a wrong URL or a Redis not started: the retry deadline (120 s here)
    is not waited out, only STREAMREC_STORE__CONNECT_TIMEOUT_S.
    """
    cfg = config(kafka_config, f"redis://{private_redis.address}/0", unique_name)
    cfg = cfg.model_copy(update={"store": cfg.store.model_copy(update={"connect_timeout_s": 2.0})})
    publish(clicks[:500], kafka_config)
    private_redis.proc.stop()
    started = time.monotonic()
    with pytest.raises(FeatureStoreUnreachable, match=r"did not answer \(STREAMREC_STORE__URL.*waited 2 s"):
        ConsumerRunner(cfg).run()
    assert time.monotonic() - started < 30


def test_a_broker_stall_longer_than_the_transaction_timeout_is_ridden_out(
    private_broker: PrivateService, redis_url: str, unique_name: str, clicks: list[Event]
) -> None:
    """Once: a stall over ~20 s ended the consumer with 'transaction failed ... Timed out'."""
    kafka = KafkaConfig(
        bootstrap_servers=private_broker.address, partitions=3, session_timeout_ms=6000,
        events_topic=f"ev-{unique_name}", dlq_topic=f"dlq-{unique_name}",
        samples_topic=f"s-{unique_name}", samples_dlq_topic=f"sdlq-{unique_name}",
    )
    ensure_topics(kafka)
    events = clicks[:3000]
    publish(events, kafka)
    runner = ConsumerRunner(config(kafka, redis_url, unique_name))
    thread, out = in_thread(runner.run)
    wait_for(lambda: runner.stats.batches >= 2)
    private_broker.pause()
    time.sleep(25)
    private_broker.resume()
    thread.join(180)
    assert isinstance(out[0], ConsumerStats), out
    assert out[0].events == len(events)
    assert_exactly_once(kafka, events)
