"""Services that never answer, and stop signals while waiting for one, from outside.

Measured before: a wrong Redis URL warned every 10 s and failed after 303 s, and SIGINT and
SIGTERM were ignored during that wait (only kill -9 ended it); a broker address that accepts
TCP connections but never answers ended in a raw librdkafka ``_TIMED_OUT ... waiting for
controller`` line after 17-20 s.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from streamrec.config import KafkaConfig, RedisStoreConfig
from streamrec.local.ports import free_port
from tests.conftest import MOVIELENS
from tests.integration.test_cli_flow import services_env
from tests.support import trained_snapshots


class Running:
    """A ``streamrec`` process whose stderr lines are collected as they come."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamrec", *args], env=env, cwd=cwd,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout_s: float = 60) -> None:
        """Until a stderr line holds ``text``."""
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, f"exited early: {self.lines}"
            assert time.monotonic() < deadline, f"no {text!r} in {self.lines}"
            time.sleep(0.1)

    def finish(self, timeout_s: float) -> int:
        """The exit status, once it exits within ``timeout_s`` (else it is killed, failing)."""
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self._reader.join(5)
            assert self.proc.stderr is not None
            self.proc.stderr.close()
            pytest.fail(f"still running {timeout_s} s later: {self.lines}")
        self._reader.join(5)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return rc

    def errors(self) -> list[str]:
        """Stderr lines but the signal handler's and the log's (timestamped) lines."""
        return [line for line in self.lines if not line.startswith(("signal ", "20"))]


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """An address that accepts TCP connections and never answers a byte."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def _env(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, **extra: str
) -> dict[str, str]:
    env = services_env(kafka_config, store_config, unique_name)
    return {**env, "STREAMREC_CONSUMER__METRICS_PORT": "0", **extra}


@pytest.mark.parametrize("command", ["run", "rebuild"])
def test_a_redis_that_never_answered_is_one_line_within_seconds(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, tmp_path: Path,
    command: str,
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    env = _env(kafka_config, store_config, unique_name)
    run = Running(["consumers", command, "--redis-url", url], env, tmp_path)
    assert run.finish(30) == 1
    assert time.monotonic() - run.started < 20  # STREAMREC_STORE__CONNECT_TIMEOUT_S (5 s) and the start
    errors = [line for line in run.lines if not line.startswith("20")]
    assert len(errors) == 1, run.lines
    assert errors[0].startswith(f"error: redis at {url} did not answer")
    assert "STREAMREC_STORE__URL" in errors[0] and "--redis-url" in errors[0]
    assert "Traceback" not in "\n".join(run.lines)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_ends_the_wait_for_redis(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, tmp_path: Path,
    signum: signal.Signals,
) -> None:
    env = _env(kafka_config, store_config, unique_name, STREAMREC_STORE__CONNECT_TIMEOUT_S="120",
               STREAMREC_STORE__URL=f"redis://127.0.0.1:{free_port()}/0")
    run = Running(["consumers", "run"], env, tmp_path)
    run.wait_for("feature store unavailable at start")
    run.proc.send_signal(signum)
    sent = time.monotonic()
    run.finish(10)
    assert time.monotonic() - sent < 5
    assert "Traceback" not in "\n".join(run.lines)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_ends_the_retries_of_an_outage(
    kafka_config: KafkaConfig, unique_name: str, tmp_path: Path, private_redis, signum: signal.Signals,
) -> None:
    """Redis answered, then froze: the batch is retried until the retry deadline, but a stop
    signal ends the retries; the batch was not committed, and is redone at the next start.
    """
    store = RedisStoreConfig(url=f"redis://127.0.0.1:{private_redis.port}/0", key_prefix=unique_name)
    env = _env(kafka_config, store, unique_name, STREAMREC_CONSUMER__RETRY_DEADLINE_S="300",
               STREAMREC_STORE__CLIENT='{"socket_timeout": 1}')
    run = Running(["consumers", "run"], env, tmp_path)
    # In its loop (Redis frozen as soon as the attach was logged caught the start-up's wait
    # instead, which `test_a_stop_signal_ends_the_wait_for_redis` and test_attach.py cover).
    run.wait_for("assigned partitions")
    private_redis.pause()
    subprocess.run(
        [sys.executable, "-m", "streamrec", "produce", str(MOVIELENS), "--limit", "50"],
        env=env, capture_output=True, timeout=60, check=True,
    )
    run.wait_for("batch failed, redoing it")
    run.proc.send_signal(signum)
    sent = time.monotonic()
    run.finish(15)
    assert time.monotonic() - sent < 5
    assert "Traceback" not in "\n".join(run.lines)


@pytest.mark.parametrize(
    "args",
    [["produce", str(MOVIELENS), "--limit", "10"], ["consumers", "run"], ["learner", "run"]],
    ids=["produce", "consumers", "learner"],
)
def test_an_address_that_accepts_but_never_answers_is_one_line_within_seconds(
    args: list[str], silent_broker: str, tmp_path: Path
) -> None:
    env = {**os.environ, "STREAMREC_LEARNER__SNAPSHOT_DIR": str(tmp_path / "snapshots")}
    run = Running([*args, "--bootstrap-servers", silent_broker], env, tmp_path)
    assert run.finish(30) == 1
    assert time.monotonic() - run.started < 15  # 5 s for an answer, and the start
    assert len(run.lines) == 1, run.lines
    line = run.lines[0]
    assert line.startswith(f"error: Kafka broker at {silent_broker} accepted a connection but did not answer")
    assert "STREAMREC_KAFKA__BOOTSTRAP_SERVERS" in line and "--bootstrap-servers" in line


@pytest.mark.parametrize("option", ['{"no.such.option": "1"}', '{"linger.ms": "abc"}'])
def test_a_client_option_the_kafka_client_refuses_is_named_as_such(
    option: str, kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str,
    tmp_path: Path,
) -> None:
    # Found by a tour of docs/operating/deployment.md: an option librdkafka refuses in
    # STREAMREC_KAFKA__CLIENT was reported as a broker that "accepted a connection but did not
    # answer a Kafka request within 5 s", though the broker was up and nothing was waited for.
    env = _env(kafka_config, store_config, unique_name, STREAMREC_KAFKA__CLIENT=option)
    run = Running(["consumers", "run"], env, tmp_path)
    assert run.finish(30) == 1
    assert len(run.errors()) == 1, run.lines
    line = run.errors()[0]
    assert line.startswith("error: STREAMREC_KAFKA__CLIENT"), line
    assert "did not answer" not in line and "configuration property" in line, line


@pytest.mark.parametrize("args", [["consumers", "run"], ["serve", "--port", "0"]], ids=str)
def test_a_redis_client_option_redis_py_does_not_take_is_one_line(
    args: list[str], kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str,
    tmp_path: Path,
) -> None:
    # Found by a tour of docs/operating/deployment.md: STREAMREC_STORE__CLIENT='{"no_such": 1}'
    # ended `consumers run` in a 30-line TypeError traceback at its first Redis call.
    snapshots = tmp_path / "snapshots"
    if args[0] == "serve":  # it loads the promoted version first
        trained_snapshots(snapshots, count=1).promote(1)
    env = _env(
        kafka_config, store_config, unique_name, STREAMREC_STORE__CLIENT='{"no_such": 1}',
        STREAMREC_LEARNER__SNAPSHOT_DIR=str(snapshots),
    )
    run = Running(args, env, tmp_path)
    assert run.finish(30) == 1
    assert len(run.errors()) == 1, run.lines
    line = run.errors()[0]
    assert line.startswith("error: STREAMREC_STORE__CLIENT") and "'no_such'" in line, line


def test_a_rebuild_of_an_events_topic_that_does_not_exist_says_so_and_creates_no_topic(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, tmp_path: Path,
) -> None:
    """Found by a tour: ``consumers rebuild`` created the pipeline's four topics before it read
    anything, so a misspelt events topic came into being (empty) beside a samples dead-letter
    topic, though a rebuild reads one topic and writes none.
    """
    missing = {"STREAMREC_KAFKA__EVENTS_TOPIC": f"no-events-{unique_name}",
               "STREAMREC_KAFKA__SAMPLES_DLQ_TOPIC": f"no-samples-dlq-{unique_name}"}
    env = _env(kafka_config, store_config, unique_name, **missing)
    run = Running(["consumers", "rebuild"], env, tmp_path)
    assert run.finish(60) == 1
    assert len(run.errors()) == 1 and run.errors()[0].startswith("error: "), run.lines
    assert run.errors()[0] == f"error: topic no-events-{unique_name} does not exist on the brokers", run.lines
    topics = AdminClient({"bootstrap.servers": kafka_config.bootstrap_servers}).list_topics(timeout=10).topics
    assert not set(missing.values()) & set(topics), sorted(topics)


def test_a_rebuild_takes_the_group_id_as_consumers_run_does(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, tmp_path: Path,
) -> None:
    """Found by a tour (test first): a store lost under ``consumers run --group-id G`` said to run
    ``streamrec consumers rebuild``, which had no ``--group-id`` (``No such option``, exit 2): only
    ``STREAMREC_CONSUMER__GROUP_ID`` named the group whose offsets a rebuild replays to.
    """
    env = _env(kafka_config, store_config, unique_name)
    run = Running(["consumers", "rebuild", "--group-id", f"other-{unique_name}"], env, tmp_path)
    assert run.finish(60) == 1
    assert len(run.errors()) == 1, run.lines
    group = f"'other-{unique_name}'"
    assert run.errors()[0].startswith(f"error: nothing to rebuild: the consumers' group {group}"), run.lines
    assert "--group-id" in run.errors()[0], run.lines
