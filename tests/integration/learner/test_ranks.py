"""Several learner ranks on paddle.distributed (gloo on CPU), on the real broker.

(a) Two ranks train the same weights as one process whose mini-batch is twice each rank's:
both train one micro-batch of every sample (``min_batch_samples`` = all of them), ordered by
(partition, offset) alike, shuffled alike; the two-rank one sums each rank's half-mini-batch
gradients (all-reduced), the one-process one takes the mean over the whole mini-batch. Equal
within float32 summation order. The two ranks run as ``streamrec learner run --workers 2``.

(b) kill -9 of one rank stops the group (the other leaves non-zero, not hanging); the group
restarted trains every sample id exactly once, counted in the learner's own snapshotted state.

(c) The number of ranks changed across restarts (2, then 1, then 2) resumes from the same
snapshot with nothing lost or doubled.

(e) Rank 0's reports and its promotion gate judge the group's micro-batch: two ranks report the
metrics, loss and counts of one process, and the gate holds a version that one process holds,
though it would pass on rank 0's own samples.

(d) A rank with no samples of its own (every sample on the other rank's partition) steps along
on padding; rank 0, holding none, still snapshots the group's counts.

(g) A rank frozen (SIGSTOP) past the rank timeout, rank 0 or the other: the group stops (the
frozen rank killed with it, not left stopped), and restarted it trains every sample once.

(h) ``streamrec learner run --workers 2`` sent SIGTERM or SIGINT alone stops its ranks and
exits 0; it or its launcher killed with -9, the ranks stop too.

(i) The group trains a micro-batch in parts while it gathers it: on a backlog each rank holds at
most ``max_part_samples`` records, every sample is trained once and each micro-batch reported
once; a rank killed between parts (b, in parts) loses and doubles nothing; ``streamrec snapshot
create`` closes a micro-batch partly trained at once; a backlog on one rank alone is not slowed
to a part each ``part_s`` of the other.

(f) A rank's gloo threads run under SCHED_BATCH (their wake-ups do not preempt the rank's own
thread), its own thread as it was, and the group's gathers still agree.

(j) A rank leaves its process group as its run ends, well or not, before the interpreter's exit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import psutil  # type: ignore[import-untyped]
import pytest
from confluent_kafka import Producer

from streamrec.config import StreamrecConfig
from streamrec.kafka.topics import create_topics
from streamrec.learner.columns import SampleColumns
from streamrec.local.ports import free_port
from streamrec.samples import Sample
from streamrec.serving.export import export_snapshot
from streamrec.serving.gate import judge
from streamrec.serving.scorer import ExportedModel
from streamrec.snapshots.store import SnapshotStore
from tests.ranked_learner import COUNTS_KEY
from tests.support import running, small_tables, wait_for

ROOT = Path(__file__).parents[3]
TS = 1_511_658_000_000
MODEL = {"tables": small_tables(2**10, 2**6, dim=4), "sequence_length": 8, "mlp_units": [8]}


def sample(n: int) -> Sample:
    seq = tuple(range(n % 5))
    return Sample(
        f"s{n}",
        f"u{n % 31}",
        TS + n * 100,
        f"i{n % 50}",
        f"c{n % 9}",
        n % 2,
        tuple(f"i{k}" for k in seq),
        tuple(f"c{k}" for k in seq),
    )


def publish(cfg: StreamrecConfig, start: int, stop: int, partition: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": cfg.kafka.bootstrap_servers, "partitioner": "murmur2_random"})
    to = -1 if partition is None else partition  # -1: the partitioner's choice
    for n in range(start, stop):
        s = sample(n)
        value, key = s.to_json(), s.user_id.encode()
        producer.produce(cfg.kafka.samples_topic, key=key, value=value, timestamp=s.ts, partition=to)
    assert producer.flush(10) == 0


_started: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _stop_leftovers() -> Iterator[None]:
    """A failed test leaves no ranks running: its launchers and their ranks are killed."""
    yield
    for proc in _started:
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait(10)
    _started.clear()


def start_ranks(
    cfg: StreamrecConfig, ranks: int, tmp_path: Path, name: str, kind: str = "counting", reports: str = ""
) -> subprocess.Popen[bytes]:
    """``tests/ranked_learner.py`` (a counting DIN, or ``din``) as ``ranks`` ranks; output in ``name.log``.

    With ``reports``, rank 0's reports and gate judgements go there (and every rank gates).
    """
    cfg_file = tmp_path / f"{name}.json"
    cfg_file.write_text(cfg.model_dump_json())
    script = [str(ROOT / "tests" / "ranked_learner.py"), str(cfg_file), kind, *([reports] if reports else [])]
    launch = [
        sys.executable,
        "-m",
        "streamrec.launch",  # Paddle's launcher, as the docs run it across hosts
        "--nproc_per_node",
        str(ranks),
        "--log_dir",
        str(tmp_path / f"{name}-logs"),
    ]
    command = [*launch, *script] if ranks > 1 else [sys.executable, *script]
    with (tmp_path / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    _started.append(proc)
    return proc


def finished(proc: subprocess.Popen[bytes], tmp_path: Path, name: str, timeout: float = 240) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{name} did not stop: {logs(tmp_path, name)}") from None


def logs(tmp_path: Path, name: str) -> str:
    files = [tmp_path / f"{name}.log", *sorted((tmp_path / f"{name}-logs").glob("workerlog.*"))]
    return "\n".join(f"--- {f.name}\n{f.read_text()[-3000:]}" for f in files if f.exists())


def run_ranks(cfg: StreamrecConfig, ranks: int, tmp_path: Path, name: str, kind: str = "counting") -> None:
    rc = finished(start_ranks(cfg, ranks, tmp_path, name, kind), tmp_path, name)
    assert rc == 0, logs(tmp_path, name)


def assert_each_once(cfg: StreamrecConfig, count: int) -> None:
    found = SnapshotStore(cfg.learner.snapshot_dir).latest_valid()
    assert found is not None
    manifest, tensors = found
    counts = tensors["state"][COUNTS_KEY.partition("/")[2]]
    assert (counts[count:] == 0).all()
    assert not (counts[:count] > 1).any(), f"{int((counts > 1).sum())} samples trained more than once"
    assert (counts[:count] == 1).all(), f"{int((counts[:count] == 0).sum())} samples never trained"
    assert manifest.samples_trained == count


@pytest.fixture
def ranks_config(pipeline_config: Callable[..., StreamrecConfig]) -> Callable[..., StreamrecConfig]:
    def make(**learner: object) -> StreamrecConfig:
        return pipeline_config(
            model=MODEL,
            learner={
                "interval_s": 1.0,
                "max_batch_samples": 100,
                "stop_when_idle_s": 4.0,
                "snapshot_every": 2,
                "rank_timeout_s": 30.0,
                "promote": "off",
                **learner,
            },
        )

    return make


def cli_env(cfg: StreamrecConfig, snapshot_dir: Path) -> dict[str, str]:
    model, learner = cfg.model, cfg.learner
    return {
        **os.environ,
        "STREAMREC_KAFKA__BOOTSTRAP_SERVERS": cfg.kafka.bootstrap_servers,
        "STREAMREC_KAFKA__SAMPLES_TOPIC": cfg.kafka.samples_topic,
        "STREAMREC_KAFKA__SAMPLES_DLQ_TOPIC": cfg.kafka.samples_dlq_topic,
        "STREAMREC_KAFKA__PARTITIONS": str(cfg.kafka.partitions),
        "STREAMREC_MODEL__TABLES": json.dumps(MODEL["tables"]),
        "STREAMREC_MODEL__SEQUENCE_LENGTH": str(model.sequence_length),
        "STREAMREC_MODEL__MLP_UNITS": json.dumps(list(model.mlp_units)),
        "STREAMREC_MODEL__TRAIN_BATCH_SIZE": str(model.train_batch_size),
        "STREAMREC_LEARNER__GROUP_ID": learner.group_id,
        "STREAMREC_LEARNER__SNAPSHOT_DIR": str(snapshot_dir),
        "STREAMREC_LEARNER__INTERVAL_S": str(learner.interval_s),
        "STREAMREC_LEARNER__MIN_BATCH_SAMPLES": str(learner.min_batch_samples),
        "STREAMREC_LEARNER__MAX_BATCH_SAMPLES": str(learner.max_batch_samples),
        "STREAMREC_LEARNER__STOP_WHEN_IDLE_S": str(learner.stop_when_idle_s),
        "STREAMREC_LEARNER__SNAPSHOT_EVERY": "1",
        "STREAMREC_LEARNER__METRICS_PORT": "0",
        "STREAMREC_LEARNER__PROMOTE": "always",
    }


def one_and_two(
    pipeline_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
    model: dict[str, Any],
    learner: dict[str, Any],
) -> tuple[StreamrecConfig, StreamrecConfig]:
    """The configs of one process (mini-batches of 64) and of two ranks (32 each), each its own
    snapshot directory (``one``, ``two``) and consumer group.
    """
    return (
        pipeline_config(
            model={**model, "train_batch_size": 64},
            learner={**learner, "snapshot_dir": tmp_path / "one", "group_id": "one"},
        ),
        pipeline_config(
            model={**model, "train_batch_size": 32},
            learner={**learner, "snapshot_dir": tmp_path / "two", "group_id": "two"},
        ),
    )


def test_two_ranks_train_the_weights_of_one_process_with_twice_the_mini_batch(
    pipeline_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    count = 601  # the last mini-batch of 64 is 25: shares of 13 and 12
    learner = {
        "interval_s": 2.0,
        "min_batch_samples": count,
        "max_batch_samples": count,
        "stop_when_idle_s": 4.0,
        "snapshot_every": 1,
        "promote": "off",
    }
    one, two = one_and_two(pipeline_config, tmp_path, MODEL, learner)
    publish(one, 0, count)
    run_ranks(one, 1, tmp_path, "one", "din")
    port = free_port()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "streamrec", "learner", "run", "--workers", "2"],
        cwd=tmp_path,
        env={**cli_env(two, tmp_path / "two"), "STREAMREC_LEARNER__METRICS_PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _started.append(cast("subprocess.Popen[bytes]", launcher))
    # rank 0 serves /metrics with the group's counts until the group stops (idle)
    scraped = ""
    while launcher.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
                scraped = reply.read().decode()
        except OSError:
            pass
        time.sleep(0.2)
    stdout = launcher.communicate(timeout=60)[0]
    assert launcher.returncode == 0, stdout[-3000:] + logs(tmp_path, "learner")
    assert "starting 2 learner ranks" in stdout
    # Paddle's chatter at a group's start is left out (40 lines before): the launcher's whole
    # configuration, glog's INFO lines as each rank joins, the table of Paddle's flags changed.
    for chatter in ("LAUNCH INFO", "Modified FLAGS", "tcp_store.cc"):
        assert chatter not in stdout, stdout[-3000:]
    assert f"streamrec_learner_samples_trained_total {float(count)}" in scraped, scraped[-2000:]
    first, second = (SnapshotStore(tmp_path / name).latest_valid() for name in ("one", "two"))
    assert first is not None and second is not None, stdout[-3000:] + logs(tmp_path, "learner")
    (m1, t1), (m2, t2) = first, second
    assert m1.samples_trained == m2.samples_trained == count and m1.micro_batches == m2.micro_batches == 1
    assert len(m2.positions) == one.kafka.partitions  # rank 0 wrote both ranks' positions
    assert sum(p.offset for p in m2.positions) == count
    assert set(t1["model"]) == set(t2["model"])
    for key, array in t1["model"].items():
        np.testing.assert_allclose(t2["model"][key], array, rtol=1e-4, atol=1e-6, err_msg=key)
    for key, array in t1["state"].items():  # known items (exchanged: each rank has its own samples)
        np.testing.assert_array_equal(t2["state"][key], array, err_msg=key)
    # rank 0 exported and promoted the version (STREAMREC_LEARNER__PROMOTE=always); it serves
    # the scores the one process's version serves
    served = SnapshotStore(tmp_path / "two")
    assert served.current() == m2.version
    batch = SampleColumns.from_samples([sample(n) for n in range(0, count, 7)])
    scores = [
        ExportedModel(export_snapshot(SnapshotStore(tmp_path / name), m.version)).score_batch(batch)
        for name, m in (("one", m1), ("two", m2))
    ]
    np.testing.assert_allclose(scores[1], scores[0], rtol=1e-4, atol=1e-6)
    assert np.ptp(scores[0]) > 0  # scores that tell samples apart: the model trained


def two_ranks_snapshotted(
    cfg: StreamrecConfig, tmp_path: Path, name: str
) -> tuple[subprocess.Popen[bytes], dict[int, psutil.Process]]:
    """Two ranks started (`start_ranks`) and past their first snapshot; the launcher and the ranks by rank."""
    proc = start_ranks(cfg, 2, tmp_path, name)
    store = SnapshotStore(cfg.learner.snapshot_dir)
    wait_for(
        lambda: bool(store.versions()) or proc.poll() is not None,
        timeout_s=120,
        what="the group's first snapshot",
    )
    ranks = {int(p.environ().get("PADDLE_TRAINER_ID", -1)): p for p in psutil.Process(proc.pid).children()}
    assert set(ranks) == {0, 1}, logs(tmp_path, name)
    return proc, ranks


# A micro-batch trained a part at a time: parts of at most 30 samples a rank (4 to the 100 of
# a rank's micro-batch), a part trained once the group holds 20.
IN_PARTS = {"max_part_samples": 30, "min_eval_samples": 20}


@pytest.mark.parametrize("learner", [{}, IN_PARTS], ids=["whole", "in-parts"])
def test_a_rank_killed_stops_the_group_which_resumes_training_each_sample_once(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
    learner: dict[str, Any],
) -> None:
    count = 3000
    cfg = ranks_config(**learner)
    publish(cfg, 0, count)
    proc, ranks = two_ranks_snapshotted(cfg, tmp_path, "killed")
    os.kill(ranks[1].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    rc = finished(proc, tmp_path, "killed", timeout=90)
    assert rc != 0, logs(tmp_path, "killed")
    assert time.monotonic() - killed_at < 60
    assert not running([ranks[0]])
    before = SnapshotStore(cfg.learner.snapshot_dir).latest_valid()
    assert before is not None and before[0].samples_trained < count  # stopped part-way
    run_ranks(cfg, 2, tmp_path, "resumed")
    assert_each_once(cfg, count)


@pytest.mark.parametrize("frozen", [0, 1])
def test_a_rank_frozen_past_the_rank_timeout_stops_the_group_which_resumes_training_each_sample_once(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
    frozen: int,
) -> None:
    """SIGSTOP (a paused VM, a stuck host): the frozen rank sends nothing and closes nothing.

    gloo reports no closed connection, so only the others' rank timeout notices; the group must
    still stop, the frozen rank with it, and resume from the last snapshot.
    """
    count = 3000
    cfg = ranks_config(rank_timeout_s=8.0)
    publish(cfg, 0, count)
    name = f"frozen{frozen}"
    proc, ranks = two_ranks_snapshotted(cfg, tmp_path, name)
    os.kill(ranks[frozen].pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        rc = finished(proc, tmp_path, name, timeout=120)
        stopped_after = time.monotonic() - frozen_at
        left = [r.pid for r in running(ranks.values())]
    finally:
        if ranks[frozen].is_running():  # a failed test must not leave it stopped for the fixture
            ranks[frozen].resume()
    assert rc != 0, logs(tmp_path, name)
    assert stopped_after < 60, f"{stopped_after:.0f}s: {logs(tmp_path, name)}"
    assert not left, logs(tmp_path, name)
    before = SnapshotStore(cfg.learner.snapshot_dir).latest_valid()
    assert before is not None and before[0].samples_trained < count  # stopped part-way
    run_ranks(cfg, 2, tmp_path, "resumed")
    assert_each_once(cfg, count)


def test_a_rank_paused_for_longer_than_gloos_own_timeout_but_within_the_rank_timeout_trains_on(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    """SIGSTOP of rank 1 for 35 s, the rank timeout 120 s: the group waits and trains on.

    gloo gives up on a collective after 30 s of its own, whatever ``rank_timeout_s`` says: rank 0,
    waiting in the part exchange for the paused rank, failed there with a gloo TIMEOUT traceback
    and the group stopped. The ranks now meet before the exchange (bounded by the rank timeout),
    as they do when rank 0 writes, exports and gates a snapshot while the others wait.
    """
    cfg = ranks_config(rank_timeout_s=120.0, stop_when_idle_s=45.0, snapshot_every=1)
    publish(cfg, 0, 300)
    proc, ranks = two_ranks_snapshotted(cfg, tmp_path, "paused")
    store = SnapshotStore(cfg.learner.snapshot_dir)

    def trained() -> int:
        manifest = store.latest()
        return 0 if manifest is None else manifest.samples_trained

    wait_for(lambda: trained() == 300 or proc.poll() is not None, timeout_s=60, what="300 trained")
    ranks[1].suspend()  # idle: between exchanges, not inside a training step
    try:
        time.sleep(35)
    finally:
        if ranks[1].is_running():  # the launcher kills it when the group fails
            ranks[1].resume()
    publish(cfg, 300, 600)
    rc = finished(proc, tmp_path, "paused", timeout=180)
    assert rc == 0, logs(tmp_path, "paused")
    assert_each_once(cfg, 600)


def test_two_ranks_train_a_backlog_a_bounded_part_at_a_time_each_sample_once(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    """A backlog fills a rank's micro-batch at once. Each rank holds at most ``max_part_samples``
    records in hand: the group trains a part when both have theirs, and reports the micro-batch
    once, at its close (the rank's share of the cap reached), over every part.
    """
    count = 1200
    cfg = ranks_config(**IN_PARTS, interval_s=60.0)  # closed by the cap, not the clock
    publish(cfg, 0, count)
    run_ranks(cfg, 2, tmp_path, "parts")
    assert_each_once(cfg, count)
    rank0 = (tmp_path / "parts-logs" / "workerlog.0").read_text()
    reports = [int(n) for n in re.findall(r"micro_batch index=\d+ samples=(\d+) ", rank0)]
    parts = re.findall(r"micro_batch index=\d+ parts=(\d+) last_part_samples=(\d+)", rank0)
    assert sum(reports) == count, rank0[-3000:]
    assert parts and all(int(p) == 4 for p, _ in parts[:-1]), parts  # 30, 30, 30 and 10 a rank
    assert all(int(last) <= 2 * 30 for _, last in parts), parts
    assert max(reports) > 2 * 30  # a report is the whole micro-batch's, not a part's


def test_a_backlog_on_one_rank_drains_at_the_groups_rate_not_a_part_at_the_other_ranks_part_s(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    """Every sample on rank 0's partitions, parts of 30 and ``part_s`` 3 s: each part, ended on
    rank 0 by its count, took rank 1's ``part_s`` before (12 micro-batches of 4 parts: 132 s from
    the first report to the last, measured). Rank 1, read to its end, now ends its part at once
    after a part rank 0 ended full.
    """
    count, part_s = 1200, 3.0
    cfg = ranks_config(**IN_PARTS, interval_s=60.0, part_s=part_s)
    publish(cfg, 0, count, partition=0)
    run_ranks(cfg, 2, tmp_path, "dry")
    assert_each_once(cfg, count)
    rank0 = (tmp_path / "dry-logs" / "workerlog.0").read_text()
    # ranked_learner's own logging format: Paddle's import no longer replaces it with Paddle's ("[...] ").
    stamps = re.findall(r"^(\S+ [\d:]+),\d+ .*micro_batch index=\d+ samples=\d+ ", rank0, re.MULTILINE)
    times = [time.mktime(time.strptime(s, "%Y-%m-%d %H:%M:%S")) for s in stamps]
    assert len(times) == 12, rank0[-3000:]  # 100 a micro-batch (the cap), in parts of 30
    assert times[-1] - times[0] < 10 * part_s, rank0[-3000:]


def test_a_snapshot_request_closes_the_groups_micro_batch_partly_trained(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    """``streamrec snapshot create`` while the ranks train a 60 s micro-batch in parts of 1 s:
    the group closes it at the next part's end and rank 0 writes the version at once.
    """
    cfg = ranks_config(**IN_PARTS, interval_s=60.0, part_s=1.0, max_batch_samples=1000,
                       snapshot_every=100, stop_when_idle_s=8.0)
    publish(cfg, 0, 200)
    proc = start_ranks(cfg, 2, tmp_path, "requested")
    rank_logs = [tmp_path / "requested-logs" / f"workerlog.{r}" for r in (0, 1)]
    wait_for(lambda: all(f.exists() and "reads partitions" in f.read_text() for f in rank_logs),
             timeout_s=120, what="both ranks reading")
    time.sleep(5)  # samples gathered and trained in parts; the micro-batch open
    started = time.monotonic()
    create = [sys.executable, "-m", "streamrec", "snapshot", "create", "--timeout", "50"]
    done = subprocess.run([*create, "--snapshot-dir", str(cfg.learner.snapshot_dir)], capture_output=True,
                          text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stdout + done.stderr + logs(tmp_path, "requested")
    assert time.monotonic() - started < 30  # not at the micro-batch's own close, 60 s on
    manifest = SnapshotStore(cfg.learner.snapshot_dir).latest()
    assert manifest is not None and manifest.request_id is not None
    # the micro-batch closed whole: every sample gathered by then, its last part trained at the close
    assert manifest.micro_batches == 1 and 0 < manifest.samples_trained <= 200
    assert sum(p.offset for p in manifest.positions) == manifest.samples_trained
    assert finished(proc, tmp_path, "requested") == 0, logs(tmp_path, "requested")
    assert_each_once(cfg, 200)


def test_the_number_of_ranks_changed_across_restarts_loses_and_doubles_nothing(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    cfg = ranks_config()
    publish(cfg, 0, 500)
    run_ranks(cfg, 2, tmp_path, "two")
    assert_each_once(cfg, 500)
    publish(cfg, 500, 1000)
    run_ranks(cfg, 1, tmp_path, "one")
    assert_each_once(cfg, 1000)
    publish(cfg, 1000, 1500)
    run_ranks(cfg, 2, tmp_path, "two-again")
    assert_each_once(cfg, 1500)


def test_a_rank_without_samples_of_its_own_trains_along_and_rank_0_counts_the_groups(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    cfg = ranks_config()
    publish(cfg, 0, 300, partition=1)  # rank 1's partition: rank 0, which snapshots, holds none
    run_ranks(cfg, 2, tmp_path, "lopsided")
    assert_each_once(cfg, 300)


def launch_on_two_hosts(
    cfgs: list[StreamrecConfig], tmp_path: Path
) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """``python -m streamrec.launch --master ... --nnodes 2 --nproc_per_node 1`` as two "hosts",
    each with its own settings, the second started 3 s after the first; each one's output.
    """
    master = f"127.0.0.1:{free_port()}"
    procs = []
    for host, cfg in zip("ab", cfgs, strict=True):
        cfg_file = tmp_path / f"host-{host}.json"
        cfg_file.write_text(cfg.model_dump_json())
        command = [sys.executable, "-m", "streamrec.launch", "--master", master, "--nnodes", "2",
                   "--nproc_per_node", "1", "--log_dir", str(tmp_path / f"{host}-logs"),
                   str(ROOT / "tests" / "ranked_learner.py"), str(cfg_file), "counting"]
        procs.append(subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        _started.append(cast(subprocess.Popen[bytes], procs[-1]))
        time.sleep(3)  # the second host comes later: the first waits for it at the master
    return procs, [p.communicate(timeout=240)[0] for p in procs]


def test_the_launch_across_hosts_as_the_docs_give_it_trains_each_sample_once_and_quietly(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    """Two "hosts" on this one: ``python -m streamrec.launch --master HOST:PORT --nnodes 2
    --nproc_per_node 1 ...`` run twice, the second a few seconds after the first (as the docs'
    across-hosts command, one rank a host). Both exit 0, every sample trained once, and the
    launchers leave the HTTP client's lines out: the first printed two ``HTTP Request: ...``
    lines every half second while it waited for the second host.
    """
    count = 300
    cfg = ranks_config()
    publish(cfg, 0, count)
    procs, out = launch_on_two_hosts([cfg, cfg], tmp_path)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in out)
    assert_each_once(cfg, count)
    assert not [line for o in out for line in o.splitlines() if "HTTP Request" in line], out[0][-3000:]


def test_a_rank_on_another_host_that_fails_as_it_starts_stops_the_group_at_once(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    """Found by a tour: across hosts, a rank refused at start (here online EWC set on one host
    only; a snapshot of other model settings does the same) left the other host's rank 0
    waiting for it at the restore's meeting until ``RANK_TIMEOUT_S`` (600 s by default; 90 s here), its
    launcher knowing nothing of the other host's rank. The failed rank now tells the group on
    its TCP store as it leaves: the other rank stops within seconds, naming the cause.
    """
    cfg = ranks_config(rank_timeout_s=90.0)
    other = cfg.model_copy(update={"model": cfg.model.model_copy(update={"ewc_lambda": 0.5})})
    started = time.monotonic()
    procs, out = launch_on_two_hosts([cfg, other], tmp_path)
    took = time.monotonic() - started
    assert [p.returncode != 0 for p in procs] == [True, True], "\n".join(o[-3000:] for o in out)
    assert took < 60, f"{took:.0f}s: " + out[0][-3000:]
    rank0 = (tmp_path / "a-logs" / "workerlog.0").read_text()
    assert "another rank left the group" in rank0, rank0[-3000:]
    rank1 = (tmp_path / "b-logs" / "workerlog.0").read_text()
    assert "STREAMREC_MODEL__EWC_LAMBDA=0" in rank1, rank1[-3000:]


def test_ranks_on_two_hosts_with_different_model_settings_are_refused_in_one_line(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    """Found by a tour: two hosts, one with ``STREAMREC_MODEL__WIDE=false``, on a fresh snapshot
    directory: the ranks' first exchange of weights of different sizes aborted one in gloo's
    C++ (``op.preamble.length <= op.nbytes``, SIGABRT) and the other raised gloo's timeout as a
    traceback 30 s later. The ranks now compare their model settings at the restore: one line.
    """
    cfg = ranks_config()
    publish(cfg, 0, 100)
    other = cfg.model_copy(update={"model": cfg.model.model_copy(update={"wide": not cfg.model.wide})})
    procs, out = launch_on_two_hosts([cfg, other], tmp_path)
    assert [p.returncode != 0 for p in procs] == [True, True], "\n".join(o[-3000:] for o in out)
    for host in "ab":
        log = (tmp_path / f"{host}-logs" / "workerlog.0").read_text()
        assert "the ranks train models of different settings" in log, log[-3000:]
        assert "EnforceNotMet" not in log, log[-3000:]


def test_a_rank_beyond_the_topics_partitions_says_so_and_trains_along(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    """Two ranks on a samples topic of one partition: rank 1 reads none. It used to say only
    ``reads partitions=`` (nothing after it); it warns now, naming the topic's partitions and
    the most ranks worth running, and trains along: every sample once.
    """
    cfg = ranks_config()
    topic = f"{cfg.kafka.samples_topic}-one"
    create_topics(cfg.kafka.bootstrap_servers, {topic: 1})
    cfg = cfg.model_copy(update={"kafka": cfg.kafka.model_copy(update={"samples_topic": topic})})
    publish(cfg, 0, 300)
    run_ranks(cfg, 2, tmp_path, "beyond")
    assert_each_once(cfg, 300)
    rank1 = (tmp_path / "beyond-logs" / "workerlog.1").read_text()
    assert f"rank 1 of 2 reads no partition: {topic} has 1" in rank1, rank1[-3000:]
    assert "run at most 1 rank" in rank1, rank1[-3000:]
    rank0 = (tmp_path / "beyond-logs" / "workerlog.0").read_text()
    assert "reads no partition" not in rank0, rank0[-3000:]


def workers_started(
    cfg: StreamrecConfig, tmp_path: Path
) -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    """``streamrec learner run --workers 2`` past its first snapshot; it and every process under it."""
    command = [sys.executable, "-m", "streamrec", "learner", "run", "--workers", "2"]
    with (tmp_path / "workers.log").open("wb") as log:
        proc = subprocess.Popen(
            command, cwd=tmp_path, env=cli_env(cfg, tmp_path / "snaps"), stdout=log, stderr=subprocess.STDOUT
        )
    _started.append(proc)
    store = SnapshotStore(tmp_path / "snaps")
    wait_for(
        lambda: bool(store.versions()) or proc.poll() is not None, timeout_s=120, what="a first snapshot"
    )
    assert proc.poll() is None, (tmp_path / "workers.log").read_text()[-3000:]
    under = psutil.Process(proc.pid).children(recursive=True)
    assert len(under) == 3, under  # the launcher and two ranks
    return proc, under


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_learner_run_with_workers_stops_every_rank_and_exits_cleanly(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
    sig: signal.Signals,
) -> None:
    """``kill`` (or a supervisor signalling the main process only) stops the group.

    The signal reaches ``streamrec learner run --workers 2`` alone (not its process group, as
    Ctrl-C would), and the ranks stop as one process does: the micro-batch finished, exit
    status 0, nothing left running. It used to leave the launcher and both ranks training.
    Each rank is signalled once: Paddle's launcher sent each SIGTERM up to three times 0.2 s
    apart, which a rank takes for a second signal (stop at once, exit 130, the micro-batch in
    hand dropped), and the other rank's next collective then failed with a traceback.
    """
    cfg = ranks_config(stop_when_idle_s=300.0)
    publish(cfg, 0, 1000)
    proc, under = workers_started(cfg, tmp_path)
    proc.send_signal(sig)
    rc = finished(proc, tmp_path, "workers", timeout=90)
    wait_for(lambda: not running(under), timeout_s=30, what="the launcher and the ranks gone")
    assert rc == 0, (tmp_path / "workers.log").read_text()[-3000:]
    for rank in (0, 1):
        log = (tmp_path / "learner-logs" / f"workerlog.{rank}").read_text()
        assert "stopping now" not in log and "Traceback" not in log, log[-3000:]
        assert "finishing the current batch" in log and "\ntrained " in log, log[-3000:]  # a clean stop
        assert log.startswith(f"==== learner rank {rank} of 2, started "), log[:300]  # mark_logs


def test_a_second_group_on_the_same_snapshot_directory_is_refused_in_one_line_on_every_rank(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    """A second ``learner run --workers 2`` on a directory a running group holds: its rank 0 is
    refused the directory's lock; its rank 1, waiting for rank 0 at the restore, says in one
    line that the exchange failed, where it ended with a gloo traceback (or the launcher
    stops it first, before it reaches the restore). The first group trains on.
    """
    cfg = ranks_config(stop_when_idle_s=300.0)
    publish(cfg, 0, 1000)
    proc, _ = workers_started(cfg, tmp_path)
    second = tmp_path / "second"
    second.mkdir()
    command = [sys.executable, "-m", "streamrec", "learner", "run", "--workers", "2"]
    done = subprocess.run(command, cwd=second, env=cli_env(cfg, tmp_path / "snaps"), capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode != 0 and "is in use by pid" in done.stdout + done.stderr, done.stdout + done.stderr
    rank0, rank1 = ((second / "learner-logs" / f"workerlog.{rank}").read_text() for rank in (0, 1))
    assert "Traceback" not in rank0 + rank1, rank0[-3000:] + rank1[-3000:]
    assert "\nerror: snapshot directory" in rank0, rank0[-3000:]
    said = [line for line in rank1.splitlines() if line.startswith("error: ")]
    assert all("rank 1 of 2: its 'restore' exchange with the other ranks failed" in s for s in said), said
    first = (tmp_path / "workers.log").read_text
    assert proc.poll() is None, first()[-3000:]
    proc.send_signal(signal.SIGTERM)
    assert finished(proc, tmp_path, "workers", timeout=90) == 0, first()[-3000:]


RANK_LEFT = """
import os, sys
import numpy as np
from streamrec.learner.ranks import RankGroup, launched_world

rank, world = launched_world()
group = RankGroup(rank, world, timeout_s=60.0)
group.gather(np.array([rank], np.int64), "joined")
if rank == 0:
    os._exit(0)  # gone: its connections closed, and the group's TCP store with them
try:
    group.gather(np.array([rank], np.int64), sys.argv[1])
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}", flush=True)
    sys.exit(3)
"""


@pytest.mark.parametrize("what", ["restore", "gradients"])
def test_a_rank_whose_peer_is_gone_says_so_in_one_line_naming_the_exchange(tmp_path: Path, what: str) -> None:
    """Two ranks joined by hand (Paddle's launcher's environment, no launcher to stop the one
    left): rank 0 leaves, rank 1's next exchange fails. `RankLost`, one line naming the rank and
    the exchange, where it was gloo's RuntimeError.
    """
    script = tmp_path / "rank_left.py"
    script.write_text(RANK_LEFT)
    master, *ends = (f"127.0.0.1:{free_port()}" for _ in range(3))
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PADDLE_TRAINER_ID": str(rank),
               "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ENDPOINTS": ",".join(ends),
               "PADDLE_CURRENT_ENDPOINT": ends[rank], "PADDLE_MASTER": master,
               "PADDLE_DISTRI_BACKEND": "gloo"}
        procs.append(subprocess.Popen([sys.executable, str(script), what], cwd=tmp_path, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    out = [p.communicate(timeout=120)[0] for p in procs]
    assert procs[0].returncode == 0, out[0][-3000:]
    assert procs[1].returncode == 3 and "Traceback" not in out[1], out[1][-3000:]
    said = [line for line in out[1].splitlines() if line.startswith(("RankLost", "RuntimeError", "Value"))]
    assert len(said) == 1 and said[0].startswith(f"RankLost: rank 1 of 2: its {what!r} exchange"), said


def test_a_rank_killed_under_learner_run_with_workers_ends_it_with_one_error_line(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    """A kill -9 of rank 1 under ``learner run --workers 2``: after the launcher's report (the
    rank, its status, the end of its log), one line says what happened and what to do, exit
    status 1. It ended with the launcher's status passed on, whatever the ranks' exits made of
    it (130, 241, ...), and no word of streamrec's.
    """
    cfg = ranks_config(stop_when_idle_s=300.0)
    publish(cfg, 0, 1000)
    proc, under = workers_started(cfg, tmp_path)
    next(p for p in under if p.environ().get("PADDLE_TRAINER_ID") == "1").kill()
    rc = finished(proc, tmp_path, "workers", timeout=90)
    wait_for(lambda: not running(under), timeout_s=30, what="the launcher and the ranks gone")
    out = (tmp_path / "workers.log").read_text()
    assert rc == 1, out[-3000:]
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("error: the learner ranks stopped with an error"), out[-3000:]
    assert "learner-logs/workerlog.<rank>" in last and "start the group again" in last, last


@pytest.mark.parametrize("killed", ["command", "launcher"])
def test_learner_run_with_workers_killed_takes_its_ranks_with_it(
    ranks_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
    killed: str,
) -> None:
    """Killed with -9, ``streamrec learner run --workers 2`` or its launcher takes the ranks along.

    Rather than have them train on, orphaned, beside the group a restart would start.
    """
    cfg = ranks_config(stop_when_idle_s=300.0)
    publish(cfg, 0, 1000)
    proc, under = workers_started(cfg, tmp_path)
    if killed == "command":
        proc.kill()
    else:
        launcher = next(p for p in under if "streamrec.launch" in p.cmdline())
        launcher.kill()
    assert proc.wait(60) != 0
    wait_for(lambda: not running(under), timeout_s=60, what="the launcher and the ranks gone")


def wait_for_version(store: SnapshotStore, version: int, proc: subprocess.Popen[bytes]) -> None:
    wait_for(
        lambda: len(store.versions()) >= version or proc.poll() is not None,
        timeout_s=180,
        what=f"version {version} in {store.root}",
    )


def rated(n: int, partition: int, flipped: bool = False) -> Sample:
    """Partition ``partition``'s own users, items and categories; an even item is liked 9 times
    in 10, an odd one once (the other way round where ``flipped``).
    """
    side = "ab"[partition]
    item = n % 20
    liked = (item % 2 == 0) == ((n * 7919) % 10 != 0)
    seq = tuple(f"{side}i{(n + k) % 20}" for k in range(n % 4))
    return Sample(
        f"{side}{n}",
        f"{side}u{n % 25}",
        TS + n * 10,
        f"{side}i{item}",
        f"{side}c{item % 5}",
        int(liked != flipped),
        seq,
        tuple(f"{side}c{(n + k) % 20 % 5}" for k in range(n % 4)),
    )


def test_two_ranks_report_and_gate_the_groups_micro_batches_as_one_process_does(
    pipeline_config: Callable[..., StreamrecConfig],
    tmp_path: Path,
) -> None:
    """Three micro-batches of 900, published one at a time: rank 0 reads partition 0, rank 1
    partition 1. The first holds few of partition 0's samples, the second many, and partition
    1's labels flipped: its version scores partition 0 (rank 0's own samples) better than the
    first version and partition 1 far worse. Judged by the third micro-batch, the group's, it
    is held, where rank 0's own samples alone would pass it.
    """
    stages = [{0: 100, 1: 800}, {0: 450, 1: 450}, {0: 300, 1: 600}]
    count = 900
    learner = {
        "interval_s": 1.0,
        "min_batch_samples": count,
        "max_batch_samples": 1000,
        "stop_when_idle_s": 8.0,
        "snapshot_every": 1,
        "promote": "gate",
        "min_eval_samples": 100,
        "rank_timeout_s": 120.0,
    }
    model = {**MODEL, "learning_rate": 0.01, "passes": 2}
    one, two = one_and_two(pipeline_config, tmp_path, model, learner)
    out = {name: tmp_path / f"{name}.jsonl" for name in ("one", "two")}
    procs = {
        "one": start_ranks(one, 1, tmp_path, "one", "din", str(out["one"])),
        "two": start_ranks(two, 2, tmp_path, "two", "din", str(out["two"])),
    }
    producer = Producer({"bootstrap.servers": one.kafka.bootstrap_servers})
    published = {0: 0, 1: 0}
    for stage, sizes in enumerate(stages):
        for partition, n in sizes.items():
            for k in range(published[partition], published[partition] + n):
                s = rated(k, partition, flipped=stage == 1 and partition == 1)
                value = s.to_json()
                producer.produce(one.kafka.samples_topic, value=value, partition=partition, timestamp=s.ts)
            published[partition] += n
        assert producer.flush(10) == 0
        for name, proc in procs.items():
            wait_for_version(SnapshotStore(tmp_path / name), stage + 1, proc)
            assert proc.poll() is None, logs(tmp_path, name)
    for name, proc in procs.items():
        assert finished(proc, tmp_path, name) == 0, logs(tmp_path, name)
    lines = {name: [json.loads(line) for line in out[name].read_text().splitlines()] for name in out}
    reports = {name: [x["report"] for x in lines[name] if "report" in x] for name in lines}
    judged = {name: [x["judgement"] for x in lines[name] if "judgement" in x] for name in lines}
    assert [r["samples"] for r in reports["two"]] == [count] * 3, logs(tmp_path, "two")
    for alone, group in zip(reports["one"], reports["two"], strict=True):
        for key in ("index", "samples", "positives", "known_samples", "dead", "steps", "first_ts", "last_ts"):
            assert group[key] == alone[key], (key, group, alone)
        assert group["event_ts"] == alone["event_ts"]
        for key in ("auc", "gauc", "known_auc", "novelty_auc", "tell_history_auc", "tell_category_auc"):
            assert group[key] == pytest.approx(alone[key], abs=1e-3, nan_ok=True), (key, group, alone)
        for key in ("logloss", "loss", "mean_prediction", "positive_rate"):
            assert group[key] == pytest.approx(alone[key], rel=1e-3), (key, group, alone)
    assert len(judged["one"]) == len(judged["two"]) == 1, lines
    (alone,), (group,) = judged["one"], judged["two"]
    assert (group["candidate"], group["served"]) == (alone["candidate"], alone["served"]) == (2, 1)
    assert not alone["passed"] and not group["passed"], (alone, group)
    for key in ("auc", "served_auc", "logloss", "served_logloss"):
        assert group[key] == pytest.approx(alone[key], rel=1e-3), (key, group, alone)
    assert SnapshotStore(tmp_path / "two").current() == SnapshotStore(tmp_path / "one").current() == 1
    # on rank 0's own samples (partition 0) the second version holds against the first
    third = SampleColumns.from_samples([rated(k, 0) for k in range(published[0] - 300, published[0])])
    scores = [
        ExportedModel(export_snapshot(SnapshotStore(tmp_path / "two"), v)).score_batch(third) for v in (2, 1)
    ]
    gate = two.learner
    own = judge(third.label, scores[0], scores[1], gate.gate_auc_margin, gate.gate_logloss_ratio)
    assert own[0], own


RANK_THREADS = """
import json, os, sys, threading
import numpy as np
from streamrec.learner.ranks import RankGroup, launched_world

rank, world = launched_world()
with RankGroup(rank, world, timeout_s=60.0) as group:  # left before the interpreter's exit, as ranks do
    gathered = group.gather(np.array([rank, 7 * rank], np.int64), "check")  # the collectives still work
    policies = {int(t): os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")}
    main = threading.get_native_id()
    out = {"gathered": [g.tolist() for g in gathered], "main": policies.pop(main),
           "batch": sum(p == os.SCHED_BATCH for p in policies.values())}
with open(sys.argv[1] + f".{rank}", "w") as f:
    json.dump(out, f)
"""


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's scheduling policies")
def test_gloos_threads_do_not_preempt_a_ranks_own_thread_on_waking(tmp_path: Path) -> None:
    # gloo's loop thread, woken while the rank's thread writes to the same connection, spun on
    # the socket until preempted (bench/HISTORY.md): under SCHED_BATCH it waits its turn instead.
    script = tmp_path / "rank_threads.py"
    script.write_text(RANK_THREADS)
    out = tmp_path / "threads"
    logs = tmp_path / "logs"
    done = subprocess.run(
        [sys.executable, "-m", "streamrec.launch", "--nproc_per_node", "2", "--log_dir", str(logs),
         str(script), str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
        check=False,
    )
    worker_logs = "\n".join(f.read_text()[-2000:] for f in sorted(logs.glob("workerlog.*")))
    assert done.returncode == 0, done.stdout[-2000:] + worker_logs
    for rank in (0, 1):
        seen = json.loads(Path(f"{out}.{rank}").read_text())
        assert seen["gathered"] == [[0, 0], [1, 7]]
        assert seen["main"] == os.SCHED_OTHER  # the rank's own thread is left as it was
        assert seen["batch"] >= 1, seen  # gloo's loop thread (and rank 0's store thread)


@pytest.mark.parametrize("fail", ["", "fail"])
def test_a_rank_leaves_the_group_before_the_interpreters_exit(tmp_path: Path, fail: str) -> None:
    """(j) A rank's ``with RankGroup`` block destroys its process group as it ends, the run ended
    well (the ranks met, rank 0 waiting for the others to be done with its TCP store) or not.

    Left to the interpreter's exit, the gloo group went in its last garbage collection, among
    Paddle's module globals, and the watch thread still woke meanwhile (once, in a full run,
    rank 0 ended with SIGSEGV after its summary: not reproduced, so not shown to be why). Of the
    threads joining started, as the interpreter's exit begins only those still run that Paddle
    gives no way to end: its comm context's gloo loop, and on rank 0 the TCP store's server;
    the others (the watch, the group's gloo loop) have ended.
    """
    out = tmp_path / "left"
    logs = tmp_path / "logs"
    done = subprocess.run(
        [sys.executable, "-m", "streamrec.launch", "--nproc_per_node", "2", "--log_dir", str(logs),
         str(ROOT / "tests" / "leaving_rank.py"), str(out), fail],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
        check=False,
    )
    worker_logs = "\n".join(f.read_text()[-2000:] for f in sorted(logs.glob("workerlog.*")))
    assert (done.returncode == 0) == (not fail), done.stdout[-2000:] + worker_logs
    for rank in (0, 1):
        left = json.loads(Path(f"{out}.{rank}.json").read_text())
        assert not left["initialized"], left
        # Paddle's comm context's gloo loop, and rank 0's TCP store server (before: 4 and 3 ran)
        assert left["running"] == (2 if rank == 0 else 1), (rank, left, worker_logs)
