"""The learner process's peak memory on a backlog: parts bounded by count against whole micro-batches.

A backlog (samples waiting when the learner starts, or a learner that fell behind) fills each
micro-batch to ``STREAMREC_LEARNER__MAX_BATCH_SAMPLES`` (200,000) in seconds, long before a
part's time (``part_s``) is up. Each part's samples are decoded into Python objects before they
are trained, about 7 KB a sample at the default 50 behaviours. streamrec: parts end at
``max_part_samples`` too (the default, 20,000). Ceiling: the same learner on the same samples
with ``max_part_samples`` equal to the micro-batch cap, so each micro-batch is decoded and
trained whole (the code before 2026-12-05). The ratio is streamrec's peak over the ceiling's.
``--workers N``: ``streamrec learner run --workers N`` instead, N learner ranks each holding its
own share of the micro-batch (the cap is a rank's); the peak is the largest process's.

    .venv/bin/python bench/learner_memory.py [--events N] [--max-part N] [--max-batch N] [--workers N]

Each learner is ``python -m streamrec learner run`` in a process of its own, reading the same
samples topic from the start (its own group and snapshot directory) until it has been idle
for 10 s; its peak resident memory and CPU time come from the kernel (``os.wait4``), not a
sampler. The samples are the consumers' own, built from generated clicks (150,000 events:
about 270,000 samples) and published to a broker started for the run. Both runs train every
sample once (their final snapshots' counts) and report their progressive AUC over the whole
run (each micro-batch's, weighted by its samples, from the learner's log).

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka import Producer

from streamrec.config import ConsumerConfig, ModelConfig, StreamrecConfig
from streamrec.consumers.processor import SampleBuilder
from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks
from streamrec.featurestore import MemoryFeatureStore
from streamrec.kafka.records import Record
from streamrec.kafka.topics import ensure_topics
from streamrec.local.launch import local_services
from streamrec.snapshots.store import SnapshotStore

REPORT = re.compile(r"micro_batch index=\d+ samples=(\d+) .*? auc=([0-9.]+|nan) ")


def publish_samples(cfg: StreamrecConfig, events: int) -> int:
    """The consumers' samples of ``events`` generated clicks, on the samples topic; how many."""
    clicks = generate_clicks(ClickStreamSpec(users=2_000, items=20_000, events=events, seed=3))
    builder = SampleBuilder(ConsumerConfig(), MemoryFeatureStore(ModelConfig().sequence_length))
    producer = Producer({"bootstrap.servers": cfg.kafka.bootstrap_servers, "linger.ms": 50})
    records = [Record(e.to_json(), i) for i, e in enumerate(clicks)]
    count = 0
    for i in range(0, len(records), 2_000):
        result = builder.process(records[i : i + 2_000])
        builder.commit(result)
        for s in result.samples:
            producer.produce(cfg.kafka.samples_topic, s.to_json(), s.user_id.encode(), timestamp=s.ts)
            producer.poll(0)
        count += len(result.samples)
    if producer.flush(60):
        raise RuntimeError("the broker did not take every sample")
    return count


@dataclass(frozen=True)
class LearnerRun:
    """One learner process over the whole backlog, as the kernel and its log saw it."""

    peak_rss_mb: int
    cpu_s: float
    wall_s: float
    micro_batches: int
    samples_trained: int | None  # its last snapshot's
    progressive_auc: float  # each micro-batch's, weighted by its samples


def run_learner(
    cfg: StreamrecConfig, tag: str, max_part: int, max_batch: int, root: Path, workers: int = 1,
    idle_s: float = 10.0,
) -> LearnerRun:
    """One ``streamrec learner run`` over the whole backlog: peak RSS, CPU, reports (``root/tag.log``).

    With ``workers`` above 1, the ranks' logs go to ``root/tag-run/learner-logs``; rank 0's reports
    reach the command's output. The kernel's peak RSS is then the largest of the command, the
    launcher and the ranks (each waited for by its parent).
    """
    env = {
        **os.environ,
        "STREAMREC_KAFKA__BOOTSTRAP_SERVERS": cfg.kafka.bootstrap_servers,
        "STREAMREC_KAFKA__SAMPLES_TOPIC": cfg.kafka.samples_topic,
        "STREAMREC_KAFKA__SAMPLES_DLQ_TOPIC": cfg.kafka.samples_dlq_topic,
        "STREAMREC_LEARNER__GROUP_ID": f"{cfg.learner.group_id}-{tag}",
        "STREAMREC_LEARNER__SNAPSHOT_DIR": str(root / tag),
        "STREAMREC_LEARNER__MAX_PART_SAMPLES": str(max_part),
        "STREAMREC_LEARNER__MAX_BATCH_SAMPLES": str(max_batch),
        "STREAMREC_LEARNER__STOP_WHEN_IDLE_S": str(idle_s),
        "STREAMREC_LEARNER__METRICS_PORT": "0",
        "STREAMREC_LEARNER__PROMOTE": "off",
    }
    log = root / f"{tag}.log"
    cwd = root / f"{tag}-run"  # where learner run --workers N puts learner-logs/
    cwd.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "streamrec", "learner", "run"]
    command += ["--workers", str(workers)] if workers > 1 else []
    start = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        # wait4 reaps the child and returns its own rusage (the kernel's peak RSS), which
        # Popen.wait does not; the exit code is then handed to Popen, which would otherwise
        # try to reap a pid that is gone (and warn that the child still runs)
        _, status, usage = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    if code:
        raise RuntimeError(f"the {tag} learner failed ({code}):\n{log.read_text()[-3000:]}")
    reports = [(int(n), float(auc)) for n, auc in REPORT.findall(log.read_text())]
    judged = [(n, auc) for n, auc in reports if auc == auc]
    latest = SnapshotStore(root / tag).latest()
    return LearnerRun(
        peak_rss_mb=round(usage.ru_maxrss / 1024),  # Linux: kilobytes
        cpu_s=round(usage.ru_utime + usage.ru_stime, 1),
        wall_s=round(time.monotonic() - start, 1),
        micro_batches=len(reports),
        samples_trained=None if latest is None else latest.samples_trained,
        progressive_auc=round(sum(n * a for n, a in judged) / sum(n for n, _ in judged), 4),
    )


def main() -> None:
    """Publish a backlog, then learn it with parts bounded by count and whole; print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=150_000)
    parser.add_argument("--max-part", type=int, default=StreamrecConfig().learner.max_part_samples)
    parser.add_argument("--max-batch", type=int, default=StreamrecConfig().learner.max_batch_samples)
    parser.add_argument("--workers", type=int, default=1, help="learner ranks (learner run --workers N)")
    args = parser.parse_args()
    with local_services() as services, tempfile.TemporaryDirectory() as tmp:
        name = uuid.uuid4().hex[:8]
        cfg = StreamrecConfig.model_validate({
            "kafka": {
                "bootstrap_servers": services.bootstrap_servers,
                "samples_topic": f"s-{name}", "samples_dlq_topic": f"sd-{name}",
            },
            "learner": {"group_id": f"l-{name}"},
        })
        ensure_topics(cfg.kafka)
        samples = publish_samples(cfg, args.events)
        root = Path(tmp)
        parts = run_learner(cfg, "parts", args.max_part, args.max_batch, root, args.workers)
        whole = run_learner(cfg, "whole", args.max_batch, args.max_batch, root, args.workers)
    for run in (parts, whole):
        if run.samples_trained != samples:
            raise RuntimeError(f"a learner trained {run.samples_trained} of {samples} samples")
    print(json.dumps({
        "benchmark": "learner_memory",
        "samples": samples,
        "max_part_samples": args.max_part,
        "max_batch_samples": args.max_batch,
        "workers": args.workers,
        "parts": asdict(parts),
        "ceiling_whole_micro_batches": asdict(whole),
        "peak_rss_ratio_parts_over_whole": round(parts.peak_rss_mb / whole.peak_rss_mb, 3),
    }))


if __name__ == "__main__":
    main()
