"""``/metrics`` over HTTP: served, scraped, closed; off at port 0; a taken port is a warning."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from streamrec.config import KafkaConfig, RedisStoreConfig
from streamrec.events import Event
from streamrec.local.ports import free_port, port_is_free, tcp_reachable
from streamrec.observability import ConsumerMetrics, LagProbe, LearnerMetrics, lag_client, serve
from streamrec.producer import publish
from tests.support import small_tables
from tests.unit.test_observability import FakeLagClient, batch_report, report

HOST = "127.0.0.1"


def get_metrics(port: int) -> dict[str, float]:
    """Scrape ``/metrics``: sample name with labels -> value."""
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@contextmanager
def kept_records(name: str, level: int) -> Iterator[list[logging.LogRecord]]:
    """Records of logger ``name`` from ``level`` (the ``streamrec`` logger may not propagate to pytest's)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(name)
    handler, was = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(was)


@pytest.fixture
def server_log() -> Iterator[list[logging.LogRecord]]:
    """Records of the serving module."""
    with kept_records("streamrec.observability.server", logging.INFO) as records:
        yield records


def test_learner_metrics_are_scraped_over_http() -> None:
    port = free_port()
    with LearnerMetrics() as metrics:
        server = metrics.serve(port, HOST)
        assert server is not None and server.port == port
        metrics.observe_report(report(1, metrics=report().metrics))
        scraped = get_metrics(port)
        assert scraped["streamrec_learner_micro_batches_total"] == 1
        assert scraped["streamrec_learner_samples_trained_total"] == 1000
        assert scraped["streamrec_learner_progressive_auc"] == 0.75
        assert scraped['streamrec_learner_train_seconds_bucket{le="2.5"}'] == 1
        assert scraped["streamrec_learner_freshness_seconds"] > 0
        metrics.observe_report(report(2))
        assert get_metrics(port)["streamrec_learner_micro_batches_total"] == 2  # live values
    assert port_is_free(HOST, port)  # closing the metrics stopped the server


def test_consumer_metrics_with_lag_are_scraped_over_http() -> None:
    port = free_port()
    client = FakeLagClient("events", {0: (0, 100), 1: (0, 40)}, committed={0: 95, 1: 40})
    with ConsumerMetrics() as metrics:
        metrics.track_lag(LagProbe(client, "events"))
        assert metrics.serve(port, HOST) is not None
        metrics.observe_batch(batch_report(dead=("not valid JSON: x",), negatives_short=2))
        scraped = get_metrics(port)
    assert scraped["streamrec_consumer_events_total"] == 100
    assert scraped["streamrec_consumer_negatives_short_total"] == 2
    assert scraped["streamrec_consumer_negatives_fallback_total"] == 0
    assert scraped['streamrec_consumer_dead_letters_total{reason="not_json"}'] == 1
    assert scraped['streamrec_consumer_lag_records{partition="0",topic="events"}'] == 5
    assert scraped['streamrec_consumer_lag_records{partition="1",topic="events"}'] == 0
    assert scraped["streamrec_consumer_lag_query_success"] == 1
    assert client.closed and port_is_free(HOST, port)


def test_the_lag_client_queues_no_log_lines_while_the_broker_is_down() -> None:
    """It is polled never, so librdkafka's lines (a reconnect every ~50 ms) would pile up unserved
    through an outage and come out at its close, as stale errors by the thousand.
    """
    with kept_records("streamrec.kafka.client", logging.DEBUG) as records:
        client = lag_client(KafkaConfig(bootstrap_servers=f"{HOST}:{free_port()}"), "lag-of-nothing")
        time.sleep(2.0)  # about 35 refused connections
        client.close()  # serves whatever was queued
    assert [r.getMessage() for r in records] == []


def test_port_zero_serves_nothing(server_log: list[logging.LogRecord]) -> None:
    assert serve(CollectorRegistry(), 0, HOST) is None
    assert LearnerMetrics().serve(0, HOST) is None
    assert [r.levelno for r in server_log] == [logging.INFO, logging.INFO]  # "metrics off", no warning


def test_a_taken_port_is_one_warning_not_a_failure(
    taken_port: int, server_log: list[logging.LogRecord]
) -> None:
    with LearnerMetrics() as metrics:
        assert metrics.serve(taken_port, HOST) is None
        metrics.observe_report(report())  # the job goes on; its metrics just are not served
    [warning] = server_log
    assert warning.levelno == logging.WARNING
    message = warning.getMessage()
    assert f"port={taken_port}" in message and "STREAMREC_LEARNER__METRICS_PORT" in message


# --- the commands ----------------------------------------------------------------------------

@pytest.fixture
def cli_env(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, tmp_path: Path
) -> dict[str, str]:
    """The environment of a ``streamrec`` process on this test's topics, keys and groups."""
    return {
        **os.environ,
        "STREAMREC_LOG_LEVEL": "INFO",
        "STREAMREC_KAFKA__BOOTSTRAP_SERVERS": kafka_config.bootstrap_servers,
        "STREAMREC_KAFKA__EVENTS_TOPIC": kafka_config.events_topic,
        "STREAMREC_KAFKA__SAMPLES_TOPIC": kafka_config.samples_topic,
        "STREAMREC_KAFKA__DLQ_TOPIC": kafka_config.dlq_topic,
        "STREAMREC_KAFKA__SAMPLES_DLQ_TOPIC": kafka_config.samples_dlq_topic,
        "STREAMREC_STORE__URL": store_config.url,
        "STREAMREC_STORE__KEY_PREFIX": store_config.key_prefix,
        "STREAMREC_CONSUMER__GROUP_ID": f"c-{unique_name}",
        "STREAMREC_LEARNER__GROUP_ID": f"l-{unique_name}",
        "STREAMREC_MODEL__TABLES": json.dumps(small_tables()),
        "STREAMREC_LEARNER__SNAPSHOT_DIR": str(tmp_path / "snapshots"),
    }


def streamrec(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamrec", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )


@pytest.mark.parametrize("command", ["consumers", "learner"])
def test_a_command_runs_on_when_its_metrics_port_is_taken(
    command: str, taken_port: int, cli_env: dict[str, str]
) -> None:
    proc = streamrec([command, "run", "--stop-when-idle", "1", "--metrics-port", str(taken_port)], cli_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "metrics off" in line]
    assert len(warnings) == 1 and "level=WARNING" in warnings[0] and f"port={taken_port}" in warnings[0]
    assert "--metrics-port" in warnings[0]


@pytest.mark.parametrize("command,section", [("consumers", "CONSUMER"), ("learner", "LEARNER")])
def test_a_command_serves_its_metrics_on_the_interface_set(
    command: str, section: str, cli_env: dict[str, str]
) -> None:
    """``STREAMREC_<SECTION>__METRICS_HOST`` narrows /metrics to one interface (every one before)."""
    port = free_port()
    env = {**cli_env, f"STREAMREC_{section}__METRICS_HOST": "127.0.0.2"}
    proc = streamrec([command, "run", "--stop-when-idle", "1", "--metrics-port", str(port)], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"serving metrics url=http://127.0.0.2:{port}/metrics" in proc.stderr, proc.stderr[-2000:]
    assert "metrics off" not in proc.stderr


def test_metrics_port_zero_turns_them_off(cli_env: dict[str, str]) -> None:
    proc = streamrec(["consumers", "run", "--stop-when-idle", "1", "--metrics-port", "0"], cli_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "metrics off (port 0)" in proc.stderr
    assert "serving metrics" not in proc.stderr and "WARNING" not in proc.stderr


def test_a_running_consumer_serves_its_progress(
    clicks: list[Event], kafka_config: KafkaConfig, cli_env: dict[str, str]
) -> None:
    events = clicks[:300]
    publish(events, kafka_config)
    scraped, out = scrape_running("consumers", cli_env, "streamrec_consumer_events_total", len(events))
    assert scraped["streamrec_consumer_events_total"] == len(events)
    assert scraped["streamrec_consumer_samples_total"] > 0
    assert scraped["streamrec_consumer_batches_total"] >= 1
    # The embedded broker's high watermarks are not trustworthy: lag values are checked with fakes.
    assert "streamrec_consumer_lag_query_success" in scraped
    assert f"consumed {len(events)} events" in out


def test_an_idle_consumer_reports_the_partitions_it_holds(
    kafka_config: KafkaConfig, cli_env: dict[str, str]
) -> None:
    # Found by a tour: a consumer that had joined and held every partition of a drained topic
    # showed streamrec_consumer_assigned_partitions 0, as the gauge moved only with a batch.
    name = "streamrec_consumer_assigned_partitions"
    scraped, _ = scrape_running("consumers", cli_env, name, kafka_config.partitions)
    assert scraped["streamrec_consumer_batches_total"] == 0


def test_a_learner_run_again_serves_the_snapshot_it_resumed_before_it_trains(
    clicks: list[Event], kafka_config: KafkaConfig, cli_env: dict[str, str]
) -> None:
    """Found by a tour: a learner restarted on a snapshot served freshness and the snapshot's
    age as NaN until its first micro-batch and snapshot, so the stale-model alerts could not
    fire for one that then trained nothing.
    """
    publish(clicks[:1000], kafka_config)
    assert streamrec(["consumers", "run", "--stop-when-idle", "3"], cli_env).returncode == 0
    first = streamrec(["learner", "run", "--interval", "5", "--stop-when-idle", "3"], cli_env)
    assert first.returncode == 0, first.stdout + first.stderr
    listing = json.loads(streamrec(["snapshot", "list", "--json"], cli_env).stdout)
    last = listing["versions"][-1]["version"]
    scraped, _ = scrape_running("learner", cli_env, "streamrec_learner_snapshot_version", last)
    assert scraped["streamrec_learner_micro_batches_total"] == 0
    assert scraped["streamrec_learner_snapshots_total"] == 0
    assert scraped["streamrec_learner_freshness_seconds"] > 0  # the clicks' newest event is long past


def scrape_running(
    command: str, env: dict[str, str], name: str, value: float
) -> tuple[dict[str, float], str]:
    """Run ``command run`` with metrics, scrape until ``name`` reads ``value``, stop it.

    The scrape and the command's output; it must exit 0 on SIGTERM (it finishes its batch).
    """
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrec", command, "run", "--stop-when-idle", "60",
         "--metrics-port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        scraped = wait_for(port, name, value, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    return scraped, out


def wait_for(port: int, name: str, value: float, proc: subprocess.Popen[str]) -> dict[str, float]:
    """Scrape until ``name`` reads ``value`` (the process must stay up)."""
    deadline = time.monotonic() + 90
    scraped: dict[str, float] = {}
    while time.monotonic() < deadline and proc.poll() is None:
        if tcp_reachable(HOST, port):  # only connects: binding here could steal its port
            scraped = get_metrics(port)
            if scraped.get(name) == value:
                return scraped
        time.sleep(0.2)  # between checks of an observable condition, not a wait for time
    pytest.fail(f"{name} never read {value}; last scrape: {scraped}")
