"""The README's command sequence, as separate processes, against the session's services."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamrec.config import KafkaConfig, RedisStoreConfig
from streamrec.local.ports import free_port
from tests.conftest import MOVIELENS
from tests.support import small_tables


def streamrec(args: list[str], env: dict[str, str], timeout: float = 120) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "streamrec", *args],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )
    assert proc.returncode == 0, f"streamrec {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def services_env(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str
) -> dict[str, str]:
    """The environment that points the commands at this test's topics, store and group."""
    return {
        **os.environ,
        "STREAMREC_KAFKA__BOOTSTRAP_SERVERS": kafka_config.bootstrap_servers,
        "STREAMREC_KAFKA__EVENTS_TOPIC": kafka_config.events_topic,
        "STREAMREC_KAFKA__SAMPLES_TOPIC": kafka_config.samples_topic,
        "STREAMREC_KAFKA__DLQ_TOPIC": kafka_config.dlq_topic,
        "STREAMREC_STORE__URL": store_config.url,
        "STREAMREC_STORE__KEY_PREFIX": store_config.key_prefix,
        "STREAMREC_CONSUMER__GROUP_ID": f"c-{unique_name}",
    }


def test_produce_consume_learn_snapshot_as_separate_commands(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, tmp_path: Path,
) -> None:
    env = {
        **services_env(kafka_config, store_config, unique_name),
        "STREAMREC_LEARNER__GROUP_ID": f"l-{unique_name}",
        "STREAMREC_MODEL__TABLES": json.dumps(small_tables()),
        "STREAMREC_LEARNER__SNAPSHOT_DIR": str(tmp_path / "snapshots"),
    }
    clicks = tmp_path / "clicks.jsonl"
    out = streamrec(["generate", str(clicks), "--events", "2000", "--seed", "3"], env)
    assert "wrote 2000 events" in out
    out = streamrec(["produce", str(clicks)], env)
    assert "published 2000 events" in out
    out = streamrec(["consumers", "run", "--stop-when-idle", "3"], env)
    assert "consumed 2000 events" in out
    out = streamrec(
        ["learner", "run", "--interval", "5", "--max-batch", "1000", "--stop-when-idle", "3"], env
    )
    assert "micro-batch    2" in out and "AUC" in out
    assert "snapshot v000001 written" in out
    listing = streamrec(["snapshot", "list"], env)
    assert "v000001" in listing


def test_the_version_a_learner_stopped_at_is_judged_when_it_runs_again(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, tmp_path: Path,
) -> None:
    """Found from outside: the version a learner writes as it stops waits for the micro-batch
    after it; a learner run again from that version never judged it (no line, no promotion),
    and serving kept the version before for as long as each run ended that way.
    """
    env = {
        **services_env(kafka_config, store_config, unique_name),
        "STREAMREC_LEARNER__GROUP_ID": f"l-{unique_name}",
        "STREAMREC_MODEL__TABLES": json.dumps(small_tables()),
        "STREAMREC_LEARNER__SNAPSHOT_DIR": str(tmp_path / "snapshots"),
        "STREAMREC_LEARNER__MIN_EVAL_SAMPLES": "50",
    }
    clicks = tmp_path / "clicks.jsonl"
    streamrec(["generate", str(clicks), "--events", "3000", "--seed", "5"], env)
    lines = clicks.read_text().splitlines(keepends=True)  # in event-time order
    halves = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    halves[0].write_text("".join(lines[:2000]))
    halves[1].write_text("".join(lines[2000:]))
    learn = ["learner", "run", "--interval", "5", "--max-batch", "1000", "--stop-when-idle", "3"]
    streamrec(["produce", str(halves[0])], env)
    streamrec(["consumers", "run", "--stop-when-idle", "3"], env)
    first = _trained(streamrec([*learn, "--snapshot-every", "1"], env))
    assert first[2:] == (None, None)  # a first run: nothing resumed, no totals apart
    listing = json.loads(streamrec(["snapshot", "list", "--json"], env))
    versions = [entry["version"] for entry in listing["versions"]]
    assert len(versions) >= 2 and not listing["versions"][-1]["promoted"]  # it waits
    last = versions[-1]
    streamrec(["produce", str(halves[1])], env)
    streamrec(["consumers", "run", "--stop-when-idle", "3"], env)
    proc = subprocess.run(
        [sys.executable, "-m", "streamrec", *learn, "--snapshot-every", "100"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )
    name = f"v{last:06d}"
    judged = [line for line in proc.stderr.splitlines() if f"version={name}" in line]
    assert any("promoted version" in line or "promotion held" in line for line in judged), proc.stderr
    # Found from outside: the closing line gave the totals since the first snapshot as this
    # run's ("trained 5 micro-batches" from a run that trained none).
    batches, samples, all_batches, all_samples = _trained(proc.stdout)
    assert (all_batches, all_samples) == (first[0] + batches, first[1] + samples), proc.stdout
    assert all_samples is not None and 0 < samples < all_samples


def _trained(out: str) -> tuple[int, int, int | None, int | None]:
    """The learner's closing line: this run's micro-batches and samples, and the totals."""
    match = re.search(
        r"^trained ([\d,]+) micro-batch(?:es)?, ([\d,]+) samples?(?: \(([\d,]+) and ([\d,]+) in all, "
        r"with the snapshot resumed\))?;", out, re.MULTILINE,
    )
    assert match, out
    return tuple(None if g is None else int(g.replace(",", "")) for g in match.groups())  # type: ignore[return-value]


def test_a_generated_feed_log_is_labelled_by_the_join_mode_from_the_command_line(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, tmp_path: Path,
    topic_reader,
) -> None:
    env = {**services_env(kafka_config, store_config, unique_name), "STREAMREC_CONSUMER__LABELS": "join"}
    feed = tmp_path / "feed.jsonl"
    out = streamrec(["generate", str(feed), "--feed", "--events", "300", "--seed", "3"], env)
    count = int(out.split()[1])
    events = [json.loads(line) for line in feed.read_text().splitlines()]
    assert count == len(events) and {e["action"] for e in events} >= {"impression", "click"}
    streamrec(["produce", str(feed)], env)
    out = streamrec(["consumers", "run", "--stop-when-idle", "3"], env)
    assert f"consumed {count} events" in out
    samples = [json.loads(m.value()) for m in topic_reader(kafka_config.samples_topic)]
    shown = {e["event_id"] for e in events if e["action"] == "impression"}
    labelled = [s for s in samples if s["sample_id"] in shown]
    assert labelled and {s["label"] for s in labelled} == {0, 1}
    assert len({s["sample_id"] for s in labelled}) == len(labelled)


def test_bad_flags_give_one_line_errors(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "streamrec", "produce", str(tmp_path / "missing.csv")],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error:") and "no such file" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args",
    [["produce", str(MOVIELENS), "--limit", "10"], ["consumers", "run"], ["learner", "run"]],
    ids=["produce", "consumers", "learner"],
)
def test_an_unreachable_broker_is_one_line_at_once(args: list[str], tmp_path: Path) -> None:
    """Once: 11-14 s and about 195 raw librdkafka lines before a 'controller' timeout."""
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "STREAMREC_LEARNER__SNAPSHOT_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "streamrec", *args, "--bootstrap-servers", address],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 1
    expected = f"error: Kafka broker at {address} is unreachable: connection refused"
    assert proc.stderr.splitlines() == [expected]
