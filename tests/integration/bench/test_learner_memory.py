"""The learner memory benchmark on a real broker: both learners train every sample of the backlog
once, one in parts of at most ``max_part_samples``, the other (the ceiling) whole micro-batches.
"""

from __future__ import annotations

import sys
from pathlib import Path

from streamrec.config import KafkaConfig, StreamrecConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from learner_memory import publish_samples, run_learner  # noqa: E402  (bench/ is a folder of scripts)


def test_both_learners_train_the_whole_backlog_once(
    kafka_config: KafkaConfig, unique_name: str, tmp_path: Path
) -> None:
    cfg = StreamrecConfig.model_validate({"kafka": kafka_config, "learner": {"group_id": f"l-{unique_name}"}})
    samples = publish_samples(cfg, 2_000)
    assert samples > 2_000  # a positive and a sampled negative for most clicks
    parts = run_learner(cfg, "parts", 500, 2_000, tmp_path, idle_s=3.0)
    whole = run_learner(cfg, "whole", 2_000, 2_000, tmp_path, idle_s=3.0)
    for run in (parts, whole):
        assert run.samples_trained == samples
        assert run.micro_batches == -(-samples // 2_000)
        assert run.peak_rss_mb > 0 and run.cpu_s > 0 and 0.0 < run.progressive_auc < 1.0  # read off its log
    assert "micro_batch index=1 parts=4 last_part_samples=500" in (tmp_path / "parts.log").read_text()
    assert " parts=" not in (tmp_path / "whole.log").read_text()


def test_two_ranks_train_the_whole_backlog_once_a_part_at_a_time(
    kafka_config: KafkaConfig, unique_name: str, tmp_path: Path
) -> None:
    """``--workers 2``: ``streamrec learner run --workers 2``, rank 0's reports in its output."""
    cfg = StreamrecConfig.model_validate({"kafka": kafka_config, "learner": {"group_id": f"l-{unique_name}"}})
    samples = publish_samples(cfg, 2_000)
    ranks = run_learner(cfg, "ranks", 500, 2_000, tmp_path, workers=2, idle_s=3.0)
    assert ranks.samples_trained == samples
    assert ranks.peak_rss_mb > 0 and ranks.cpu_s > 0 and 0.0 < ranks.progressive_auc < 1.0
    assert " parts=" in (tmp_path / "ranks.log").read_text()
    assert (tmp_path / "ranks-run" / "learner-logs" / "workerlog.1").exists()
