"""Integration fixtures: one real broker and Redis per session on free ports, unique names per test.

The whole tier is skipped, with the reason, when the broker or Redis binary is missing.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from streamrec.config import KafkaConfig, RedisStoreConfig, StreamrecConfig
from streamrec.errors import ConsumeError, ServiceError
from streamrec.kafka import transactions
from streamrec.kafka.clients import make_producer
from streamrec.kafka.topics import create_topics, ensure_topics, topic_id
from streamrec.local.launch import (
    LocalServices,
    broker_binary,
    local_services,
    redis_binary,
    start_broker,
    start_redis,
)
from streamrec.local.ports import free_port
from streamrec.local.processes import ManagedProcess
from tests.support import small_tables

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test in this directory ``integration`` (select with ``-m integration``)."""
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def service_binaries() -> tuple[str, str]:
    """Paths of the broker and redis-server binaries; skips the test when either is missing."""
    try:
        return broker_binary(), redis_binary()
    except ServiceError as exc:
        pytest.skip(f"integration tier needs the local broker and Redis binaries: {exc}")


@pytest.fixture(scope="session")
def services(service_binaries: tuple[str, str]) -> Iterator[LocalServices]:
    """A Tansu broker and a redis-server on free ports, shared by the session."""
    with local_services() as running:
        yield running


@pytest.fixture
def bootstrap_servers(services: LocalServices) -> str:
    """``host:port`` of the session broker."""
    return services.bootstrap_servers


@pytest.fixture
def redis_url(services: LocalServices) -> str:
    """URL of database 0 of the session Redis."""
    return services.redis_url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client on an empty database, emptied again in teardown."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def unique_name() -> str:
    """A fresh suffix for topic, group and key names, so tests never see each other's data."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def kafka_config(bootstrap_servers: str, unique_name: str) -> KafkaConfig:
    """A KafkaConfig on the session broker with this test's own, already created topics."""
    cfg = KafkaConfig(
        bootstrap_servers=bootstrap_servers,
        events_topic=f"events-{unique_name}",
        dlq_topic=f"events-dlq-{unique_name}",
        samples_topic=f"samples-{unique_name}",
        samples_dlq_topic=f"samples-dlq-{unique_name}",
        partitions=3,
        session_timeout_ms=6000,
    )
    topics = (cfg.events_topic, cfg.dlq_topic, cfg.samples_topic, cfg.samples_dlq_topic)
    create_topics(bootstrap_servers, dict.fromkeys(topics, cfg.partitions))
    return cfg


@pytest.fixture
def store_config(redis_url: str, redis_client: redis.Redis, unique_name: str) -> RedisStoreConfig:
    """The Redis feature store on the session Redis with a unique key prefix; the db is
    emptied after.
    """
    return RedisStoreConfig(url=redis_url, key_prefix=f"t{unique_name}")


def app_producer(kafka: KafkaConfig, **options: object) -> Producer:
    """A producer as an application on confluent-kafka makes one, told the Java client's
    partitioner as the README tells it (librdkafka's own default is CRC32, which the
    consumers dead-letter under the default ``STREAMREC_KAFKA__PARTITIONER``).
    """
    conf = {"bootstrap.servers": kafka.bootstrap_servers, "partitioner": "murmur2_random"}
    return Producer({**conf, **options})


def read_committed(bootstrap_servers: str, topic: str, timeout_s: float = 10.0) -> list[Message]:
    """Every committed record of ``topic``, read by partition assignment (no group join)."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap_servers,
        "group.id": "unused",  # required by librdkafka; assign() never joins it
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    })
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        consumer.assign(parts)
        out: list[Message] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(parts) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                err = msg.error()
                if err is None:
                    out.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition() or 0)
        assert len(at_end) == len(parts), f"{topic}: did not reach the end in {timeout_s}s"
        return out
    finally:
        consumer.close()


def recreate_topic(kafka: KafkaConfig, topic: str) -> str:
    """Delete ``topic`` and create it again, as an operator would; its new topic id."""
    before = topic_id(kafka, topic)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})  # alive until answered
    admin.delete_topics([topic])[topic].result(10)
    deadline = time.monotonic() + 30
    while True:
        try:
            ensure_topics(kafka)
            after = topic_id(kafka, topic)
        except (ServiceError, ConsumeError):  # the deletion may still be under way
            after = None
        if after is not None and after != before:
            return after
        assert time.monotonic() < deadline, f"{topic} was not created again"
        time.sleep(0.2)


@pytest.fixture
def topic_reader(bootstrap_servers: str) -> Callable[[str], list[Message]]:
    """``read(topic)``: all committed records of a topic on the session broker."""
    return lambda topic: read_committed(bootstrap_servers, topic)


@pytest.fixture
def aborts_unsent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The consumers' transactions keep their records queued in the producer until the commit
    (``linger.ms`` 5 s; a commit flushes at once), so an injected abort drops them unsent.

    The embedded broker hands ``read_committed`` readers the records of an aborted transaction
    that reached it, which Apache Kafka filters out (README, ``kafka/test_embedded_broker.py``):
    a crash test on it checks the consumers' side (the abort, the redo, Redis's idempotence,
    the offsets) only when the aborted records were never sent.
    """
    monkeypatch.setattr(
        transactions, "make_producer", lambda kcfg, **kw: make_producer(kcfg, **kw, **{"linger.ms": 5_000})
    )


@pytest.fixture
def pipeline_config(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, tmp_path: Path
) -> Callable[..., StreamrecConfig]:
    """``make(consumer={...}, model={...}, learner={...})``: a whole config on this test's
    topics, keys and snapshot dir, with small tables and short idle stops; the given
    sections override.
    """

    def make(**sections: dict[str, object]) -> StreamrecConfig:
        base: dict[str, dict[str, object]] = {
            "consumer": {"group_id": f"c-{unique_name}", "stop_when_idle_s": 3.0},
            "model": {"tables": small_tables(item_rows=2**16)},
            "learner": {
                "group_id": f"l-{unique_name}", "interval_s": 60.0, "stop_when_idle_s": 3.0,
                "snapshot_every": 100, "snapshot_dir": tmp_path,
            },
        }
        for name, values in sections.items():
            base[name] = {**base.get(name, {}), **values}
        return StreamrecConfig.model_validate({"kafka": kafka_config, "store": store_config, **base})

    return make



def cluster_ports(host: str, count: int) -> list[int]:
    """Free ports whose cluster-bus port (+10000) is free too, so at most 55535."""
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randint(20_000, 55_000)
        if port not in ports and all(_bindable(host, p) for p in (port, port + 10_000)):
            ports.append(port)
    return ports


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="session")
def redis_cluster_url(
    service_binaries: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A real three-primary Redis Cluster (no replicas), formed with CLUSTER ADDSLOTS/MEET."""
    host = "127.0.0.1"
    ports = cluster_ports(host, 3)
    root = tmp_path_factory.mktemp("redis-cluster")
    procs = []
    try:
        for port in ports:
            node_dir = root / str(port)
            node_dir.mkdir()
            procs.append(start_redis(host, port, node_dir, extra_args=[
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            ]))
        nodes = [redis.Redis(host=host, port=p) for p in ports]
        bounds = [0, 5461, 10922, 16384]
        for node, start, end in zip(nodes, bounds, bounds[1:], strict=False):
            node.execute_command("CLUSTER ADDSLOTS", *range(start, end))
        for node in nodes[1:]:
            node.execute_command("CLUSTER MEET", host, ports[0])
        deadline = time.monotonic() + 30
        while not all(n.cluster("INFO")["cluster_state"] == "ok" for n in nodes):
            if time.monotonic() > deadline:
                pytest.fail("the test Redis Cluster did not reach cluster_state:ok in 30 s")
            time.sleep(0.1)
        yield f"redis://{host}:{ports[0]}"
    finally:
        for proc in procs:
            proc.stop()


@dataclass(frozen=True)
class PrivateService:
    """A service process of one test's own, and where it listens."""

    proc: ManagedProcess
    port: int

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    def pause(self) -> None:
        """Freeze it (SIGSTOP): it holds its connections but answers nothing."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Undo `pause` (nothing to do once it has stopped)."""
        if self.proc.alive():
            os.kill(self.proc.pid, signal.SIGCONT)


@pytest.fixture
def private_redis(service_binaries: tuple[str, str], tmp_path: Path) -> Iterator[PrivateService]:
    """A redis-server of this test's own on a free port, to stop, pause or restart."""
    port = free_port()
    service = PrivateService(start_redis("127.0.0.1", port, tmp_path / "redis"), port)
    yield service
    service.resume()  # a stopped process would not stop
    service.proc.stop()


@pytest.fixture
def private_broker(service_binaries: tuple[str, str], tmp_path: Path) -> Iterator[PrivateService]:
    """A Tansu broker of this test's own on a free port, to pause or stop."""
    port = free_port()
    service = PrivateService(start_broker("127.0.0.1", port, tmp_path / "broker"), port)
    yield service
    service.resume()
    service.proc.stop()
