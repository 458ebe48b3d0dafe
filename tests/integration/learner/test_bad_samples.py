"""Malformed samples on the real broker: dead-lettered whole with a reason, the valid ones all
trained, the snapshot finite, and a restarted learner trains and dead-letters nothing twice.

Before, seven of these kinds ended the learner with a traceback on every restart, and
``label: null`` trained silently and turned every weight to NaN.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import msgspec
import numpy as np
import orjson
from confluent_kafka import Message, Producer

from streamrec.config import StreamrecConfig
from streamrec.features import FeatureSpec
from streamrec.learner.din import DINLearner
from streamrec.learner.runner import LearnerRunner, LearnerStats
from streamrec.samples import FeatureValue, Sample
from streamrec.snapshots.store import SnapshotStore
from tests.support import small_tables

TS = 1_511_658_000_000
VALID = 240
BATCH = 60


def sample(n: int) -> Sample:
    seq = tuple(range(n % 7))
    return Sample(
        f"e{n}", f"u{n % 13}", TS + n * 1000, f"i{n % 50}", f"c{n % 9}", n % 2,
        tuple(f"i{k}" for k in seq), tuple(f"c{k}" for k in seq),
    )


def doc(n: int, **over: object) -> bytes:
    """Sample n's wire form with fields replaced (``...`` removes one)."""
    fields = {**orjson.loads(sample(n).to_json()), **over}
    return orjson.dumps({k: v for k, v in fields.items() if v is not ...})


# Every malformed kind, with what its reason must say.
MALFORMED: list[tuple[bytes | None, str]] = [
    (b'{"sample_id": "x", ', "not valid JSON"),
    (None, "null value"),
    (doc(1, seq_items=...), "missing field(s): seq_items"),
    (doc(2, seq_categories=["c1", "c2", "c3", "c4", "c5", "c6", "c7"]), "sequences differ in length"),
    (doc(3, ts=str(TS)), "field 'ts' must be"),
    (doc(4, item_id=4), "field 'item_id' must be"),
    (b'[{"sample_id": "x"}]', "expected a JSON object, got list"),
    (doc(5, label=None), "field 'label' must be 0 or 1"),
    (doc(6, label=2), "field 'label' must be 0 or 1"),
    (doc(7, label=0.5), "field 'label' must be 0 or 1"),
    (doc(8, ts=-1), "field 'ts' must be"),
    (doc(9, user_id=""), "field 'user_id' must be"),
    (doc(10, seq_items="i1i2", seq_categories="c1c2"), "field 'seq_items' must be a list"),
]


def publish(bootstrap_servers: str, topic: str) -> None:
    """The valid samples with a malformed record after every 18th, keyed by user as the
    consumers key them, stamped with event time.
    """
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    every = VALID // len(MALFORMED)
    for n in range(VALID):
        s = sample(n)
        producer.produce(topic, key=s.user_id.encode(), value=s.to_json(), timestamp=s.ts)
        if n % every == 0 and n // every < len(MALFORMED):
            producer.produce(topic, key=b"bad", value=MALFORMED[n // every][0], timestamp=s.ts)
    assert producer.flush(10) == 0


def header(msg: Message, name: str) -> bytes:
    """A dead letter's ``streamrec.<name>`` header."""
    value = dict(msg.headers() or [])[f"streamrec.{name}"]
    assert isinstance(value, bytes)
    return value


def run_learner(cfg: StreamrecConfig) -> LearnerStats:
    return LearnerRunner(cfg, DINLearner(cfg.model)).run()


def test_malformed_samples_are_dead_lettered_and_never_stop_or_poison_the_learner(
    pipeline_config: Callable[..., StreamrecConfig], topic_reader: Callable[[str], list[Message]],
) -> None:
    cfg = pipeline_config(
        model={"tables": small_tables(2**10, 2**6, dim=4), "sequence_length": 8},
        learner={"max_batch_samples": BATCH},
    )
    publish(cfg.kafka.bootstrap_servers, cfg.kafka.samples_topic)

    stats = run_learner(cfg)

    assert stats.samples_trained == VALID  # every valid sample, none lost beside a bad one
    assert stats.dead == len(MALFORMED)
    assert stats.bad_batches == 0
    dead = topic_reader(cfg.kafka.samples_dlq_topic)
    assert Counter(m.value() for m in dead) == Counter(raw for raw, _ in MALFORMED)  # whole
    reasons = {m.value(): header(m, "reason").decode() for m in dead}
    for raw, expected in MALFORMED:
        assert expected in reasons[raw], (raw, reasons[raw])
    for m in dead:
        assert m.key() == b"bad" and header(m, "topic") == cfg.kafka.samples_topic.encode()
        assert int(header(m, "offset")) >= 0

    found = SnapshotStore(cfg.learner.snapshot_dir).latest_valid()
    assert found is not None
    manifest, tensors = found
    assert manifest.samples_trained == VALID
    for group, arrays in tensors.items():
        for name, array in arrays.items():
            if np.issubdtype(array.dtype, np.floating):
                assert np.isfinite(array).all(), f"{group}/{name}"

    again = run_learner(cfg)  # resumes past every record, trained or dead-lettered
    assert (again.micro_batches, again.samples_trained) == (stats.micro_batches, VALID)
    assert again.dead == 0
    assert len(topic_reader(cfg.kafka.samples_dlq_topic)) == len(MALFORMED)


def test_samples_holding_a_declared_feature_of_another_kind_are_dead_lettered(
    pipeline_config: Callable[..., StreamrecConfig], topic_reader: Callable[[str], list[Message]],
) -> None:
    # Found by a tour of docs/your-features.md: consumers that declared genres ids, then an id,
    # wrote samples of both kinds, and the learner ended with a traceback on every restart
    # (ValueError: feature 'genres' holds values of kinds ['id', 'ids'] in one batch).
    base = pipeline_config(model={"tables": small_tables(2**10, 2**6, dim=4), "sequence_length": 8})
    cfg = base.model_copy(update={"features": (FeatureSpec(name="genres", kind="ids"),)})
    producer = Producer({"bootstrap.servers": cfg.kafka.bootstrap_servers})
    for n in range(VALID):
        s = sample(n)
        genres: FeatureValue = ("a", "b") if n % 10 else "drama"  # one in ten of the other kind
        s = msgspec.structs.replace(s, features={"genres": genres},
                                    seq_features={"genres": tuple(("c",) for _ in s.seq_items)})
        producer.produce(cfg.kafka.samples_topic, key=s.user_id.encode(), value=s.to_json(), timestamp=s.ts)
    assert producer.flush(10) == 0

    stats = LearnerRunner(cfg, DINLearner(cfg.model, schema=cfg.feature_schema())).run()

    assert (stats.samples_trained, stats.dead) == (VALID - VALID // 10, VALID // 10)
    reasons = {header(m, "reason").decode() for m in topic_reader(cfg.kafka.samples_dlq_topic)}
    assert reasons == {"feature 'genres' is declared ids and the sample holds id values: the consumers "
                       "declare it otherwise (STREAMREC_FEATURES)"}
