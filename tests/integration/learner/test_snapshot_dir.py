"""The learner's snapshot directory from outside: a second learner is refused with the holder
named, a killed holder frees it, an unusable directory fails at start in one line.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from streamrec.config import KafkaConfig, StreamrecConfig
from streamrec.errors import SnapshotInUse
from streamrec.learner.din import DINLearner
from streamrec.learner.runner import LearnerRunner
from tests.support import small_tables

# Takes the snapshot directory's lock, says so, then holds it until killed.
_HOLDER = """
import sys
from pathlib import Path
from streamrec.snapshots.store import SnapshotStore
SnapshotStore(Path(sys.argv[1])).lock()
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def learner_env(kafka_config: KafkaConfig, unique_name: str) -> dict[str, str]:
    """Environment for a ``streamrec learner run`` process on this test's topics."""
    return {
        **os.environ,
        "STREAMREC_KAFKA__BOOTSTRAP_SERVERS": kafka_config.bootstrap_servers,
        "STREAMREC_KAFKA__SAMPLES_TOPIC": kafka_config.samples_topic,
        "STREAMREC_KAFKA__EVENTS_TOPIC": kafka_config.events_topic,
        "STREAMREC_KAFKA__DLQ_TOPIC": kafka_config.dlq_topic,
        "STREAMREC_LEARNER__GROUP_ID": f"l-{unique_name}",
        "STREAMREC_MODEL__TABLES": json.dumps(small_tables(2**10, 2**8, dim=4)),
    }


def learner_run(snapshot_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    args = ["learner", "run", "--snapshot-dir", str(snapshot_dir), "--stop-when-idle", "1"]
    return subprocess.run(
        [sys.executable, "-m", "streamrec", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def error_line(out: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line of a failed command, with no traceback anywhere."""
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out.stderr
    return errors[0]


def test_a_second_learner_process_is_refused_until_the_holder_dies(
    tmp_path: Path, learner_env: dict[str, str]
) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
            refused = learner_run(tmp_path, learner_env)
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait()
    error = error_line(refused)
    assert error.startswith(f"error: snapshot directory {tmp_path} is in use by pid {holder.pid} on host")
    assert error.endswith("is another `streamrec learner run` running?")
    assert "micro-batch" not in refused.stdout

    started = learner_run(tmp_path, learner_env)  # the kernel dropped the killed holder's lock
    assert started.returncode == 0, started.stdout + started.stderr
    assert "trained 0 micro-batches" in started.stdout


def test_a_file_as_snapshot_directory_is_one_line_at_start(
    tmp_path: Path, learner_env: dict[str, str]
) -> None:
    path = tmp_path / "snapshots"
    path.write_text("")
    out = learner_run(path, learner_env)
    assert error_line(out) == f"error: snapshot directory {path} is not a directory"
    assert out.stdout == ""


def test_runner_holds_the_directory_until_run_ends(
    pipeline_config: Callable[..., StreamrecConfig],
) -> None:
    cfg = pipeline_config(model={"tables": small_tables(2**10, 2**8, dim=4)})
    first = LearnerRunner(cfg, DINLearner(cfg.model))
    with pytest.raises(SnapshotInUse, match=f"pid {os.getpid()}"):
        LearnerRunner(cfg, DINLearner(cfg.model))
    stop = threading.Event()
    stop.set()
    first.run(stop)
    with LearnerRunner(cfg, DINLearner(cfg.model)) as second:
        assert second.stats.micro_batches == 0


def test_a_learner_on_an_empty_directory_whose_group_trained_before_says_what_it_starts(
    pipeline_config: Callable[..., StreamrecConfig], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A mistyped ``--snapshot-dir`` (noted by the snapshots tour): the learner found no snapshot,
    said so at INFO and began a new model at the positions its group committed, leaving what the
    group trained before behind without a word. It warns now, naming the directory and the
    group; a group that never committed starts as quietly as before.
    """
    from tests.integration.learner.test_parts import publish

    cfg = pipeline_config(learner={"snapshot_dir": tmp_path / "snaps", "max_batch_samples": 100,
                                   "stop_when_idle_s": 2.0, "snapshot_every": 1, "promote": "off"})
    publish(cfg, range(300))
    with caplog.at_level(logging.WARNING):
        LearnerRunner(cfg, DINLearner(cfg.model)).run()
    assert not [r for r in caplog.records if "no snapshot" in r.getMessage()]
    typo = tmp_path / "snpas"
    elsewhere = cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"snapshot_dir": typo})})
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        LearnerRunner(elsewhere, DINLearner(elsewhere.model)).run()
    warned = [r.getMessage() for r in caplog.records if "no snapshot" in r.getMessage()]
    assert len(warned) == 1, warned
    assert str(typo) in warned[0] and cfg.learner.group_id in warned[0], warned[0]
    assert "STREAMREC_LEARNER__SNAPSHOT_DIR" in warned[0]
