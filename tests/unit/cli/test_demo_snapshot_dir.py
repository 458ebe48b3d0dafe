"""The demo refuses, before any service starts, what it cannot run: a used snapshot dir, no events.

The demo's broker starts empty, so an earlier run's snapshots point at samples of a topic that is
gone. A tour ran the same ``streamrec demo --snapshot-dir DIR`` twice: the second read the data,
started the broker and Redis, then stopped with the learner's error about a samples topic
"created again since the snapshot" and a setting to train the old model on, whose summary then
counted the earlier run's micro-batches and samples as its own.
"""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from streamrec.cli import app


def test_a_snapshot_dir_holding_versions_is_refused_before_any_service_starts(tmp_path: Path) -> None:
    (tmp_path / "v000006").mkdir()
    result = CliRunner().invoke(
        app, ["demo", "--data", "synthetic:events=10", "--snapshot-dir", str(tmp_path)]
    )
    assert result.exit_code == 1
    words = " ".join(result.output.split())
    assert f"--snapshot-dir {tmp_path} already holds v000006" in words
    assert "broker at" not in words  # refused before the services start
    assert "read 10 events" not in words


def test_a_dataset_of_no_events_is_refused_before_any_service_starts(tmp_path: Path) -> None:
    """An empty file is a demo of nothing, refused as the backtest and ``--limit 0`` are.

    A tour gave ``--data`` an empty JSONL file: the demo started the broker and Redis, waited
    until idle, printed a summary of zeros and dashes and exited 0.
    """
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    result = CliRunner().invoke(
        app, ["demo", "--data", str(empty), "--snapshot-dir", str(tmp_path / "snapshots")]
    )
    assert result.exit_code == 1
    words = " ".join(result.output.split())
    assert f"{empty}: no events to replay or publish" in words
    assert "broker at" not in words
    assert not (tmp_path / "snapshots").exists()
