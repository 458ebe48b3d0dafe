"""The events topic deleted and created again (or a broker that keeps nothing restarted, as
``streamrec up --data-dir`` keeps Redis but not the broker) under a feature store that kept its
data, on the real broker and Redis.

The store remembers each event by the record it came in (``partition:offset``): the same record
read again is a batch redone after an aborted commit, and yields its samples again. A new topic's
offsets start over, so before, an event published again into it at the same place passed for a
redo and its samples went out a second time (reproduced from outside with the CLI: 5,000 events
published again after `streamrec down` and `up --data-dir`, 2,352 samples a second time, no
duplicate counted).
"""

from __future__ import annotations

from collections import Counter

from streamrec.config import KafkaConfig, RedisStoreConfig, StreamrecConfig
from streamrec.consumers.native_runner import ConsumerRunner
from streamrec.events import Event
from streamrec.producer import publish
from streamrec.samples import Sample
from tests.integration.conftest import read_committed, recreate_topic


def test_events_published_again_into_a_recreated_events_topic_are_duplicates(
    kafka_config: KafkaConfig, store_config: RedisStoreConfig, unique_name: str, clicks: list[Event],
) -> None:
    cfg = StreamrecConfig.model_validate({
        "kafka": kafka_config, "store": store_config,
        "consumer": {"group_id": f"c-{unique_name}", "stop_when_idle_s": 3.0, "batch_size": 200},
    })
    old, new = clicks[:800], clicks[800:1200]
    publish(old, kafka_config)
    first = ConsumerRunner(cfg).run()
    assert first.events == 800 and first.samples > 0

    recreate_topic(kafka_config, kafka_config.events_topic)
    publish(old + new, kafka_config)  # the same events again, at the same partitions and offsets
    second = ConsumerRunner(cfg).run()
    assert second.events == 1200

    records = read_committed(kafka_config.bootstrap_servers, kafka_config.samples_topic)
    ids = Counter(Sample.from_json(m.value() or b"").sample_id for m in records)
    twice = [sid for sid, n in ids.items() if n > 1]
    assert not twice, f"{len(twice)} samples sent twice, e.g. {twice[:3]}"
    assert second.samples > 0  # the new events' samples went out
    assert len(ids) == first.samples + second.samples
