"""Serve's click join on a Redis Cluster (``STREAMREC_STORE__CLUSTER=true``), as the feature store runs there.

Found by the serving tour: `start_click_join` made a plain client of the store's URL whatever
``cluster`` said, so on a Cluster every served list's record and every click met a MOVED reply
for keys of another node's slots (each request's record is a key of its own slot), and the
figures read nothing. Here on a real three-primary Cluster: lists recorded under request ids
whose keys spread over every primary, clicks read from the events topic and joined, the
figures read, and the scripts loaded again after every node lost them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import redis
from redis.cluster import RedisCluster

from streamrec.config import StreamrecConfig
from streamrec.kafka.clients import make_producer, produce
from streamrec.local.ports import free_port
from streamrec.serving.clicks import _SETTLE, ArmClicks, ClickCollector, start_click_join
from streamrec.snapshots.traffic import Arm, TrafficPlan
from tests.integration.serving.test_clicks import click
from tests.support import wait_for

PLAN = TrafficPlan("ab", "exp-cluster", (Arm("a", 1, 5000), Arm("b", 2, 5000)))


def test_the_click_join_records_and_joins_on_a_redis_cluster(
    redis_cluster_url: str, pipeline_config: Callable[..., StreamrecConfig], unique_name: str
) -> None:
    store = {"url": redis_cluster_url, "cluster": True, "key_prefix": unique_name}
    cfg = pipeline_config(
        store=store, serving={"click_join": True, "click_window_s": 0, "click_group": f"clicks-{unique_name}"}
    )
    join, consumer = start_click_join(cfg)
    try:
        assert isinstance(join.client, RedisCluster)
        ids = [f"r{n}" for n in range(60)]
        for n, request_id in enumerate(ids):
            join.served(PLAN, request_id, "ab"[n % 2], 1 + n % 2)
        cluster = RedisCluster.from_url(redis_cluster_url)
        keys = [f"{join.prefix}:req:{request_id}" for request_id in ids]
        nodes = {cluster.get_node_from_key(key).name for key in keys}
        assert len(nodes) == 3, nodes  # the records spread over every primary
        assert all(cluster.exists(key) for key in keys)

        producer = make_producer(cfg.kafka)
        clicked = ids[::3]
        for request_id in clicked:
            produce(producer, cfg.kafka.events_topic, click(request_id), key=b"u")
        producer.flush(10)
        arms = Counter("ab"[int(r[1:]) % 2] for r in clicked)
        want = {
            ("a", "v000001"): ArmClicks(30, 30, arms["a"]),
            ("b", "v000002"): ArmClicks(30, 30, arms["b"]),
        }
        wait_for(lambda: join.figures(PLAN) == want, 30, "the clicks joined on the Cluster")

        cluster.script_flush()  # on every primary: each lost its scripts (restarted, flushed)
        for node in cluster.get_primaries():
            assert node.redis_connection.script_exists(join._script(_SETTLE).sha) == [False]
        join.served(PLAN, "r-after-flush", "a", 1)
        assert join.clicked({"request_id": "r-after-flush", "item_id": "i1", "action": "click"})
        assert join.figures(PLAN)[("a", "v000001")] == ArmClicks(31, 31, arms["a"] + 1)
    finally:
        consumer.stop()


def test_a_cluster_down_as_serve_starts_is_an_outage_of_the_join_not_a_failed_start(
    pipeline_config: Callable[..., StreamrecConfig], unique_name: str
) -> None:
    """As with a standalone Redis: serve starts, each record fails as a Redis error (logged by
    the caller, the answer still sent), and /metrics reads no figures rather than failing.
    """
    store = {"url": f"redis://127.0.0.1:{free_port()}", "cluster": True, "key_prefix": unique_name}
    cfg = pipeline_config(store=store, serving={"click_join": True, "click_group": f"clicks-{unique_name}"})
    join, consumer = start_click_join(cfg)  # the Cluster's client is made at first use
    try:
        with pytest.raises(redis.ConnectionError, match="STREAMREC_STORE__CLUSTER"):
            join.served(PLAN, "r1", "a", 1)
        families = list(ClickCollector(join, lambda: PLAN).collect())
        assert [f.samples for f in families] == [[], [], []]
    finally:
        consumer.stop()
