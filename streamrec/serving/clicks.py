r"""Click-through per arm: served lists recorded in Redis, click events joined to them by request id.

Chosen: serve both records and joins, and the consumers stay as they are. While a canary or an
A/B test runs, each answered ``/score`` records its request id's arm and version in Redis
(``<prefix>:req:<id>``, expiring after ``click_ttl_s``: how long a shown list may still
be clicked), counts the list served, once per request id (a marker ``<prefix>:{<salt>}:list:<id>``
with the same expiry; hash ``<prefix>:{<salt>}:served``, field
``<arm>\t<version>``) and puts it among the lists pending (sorted set ``<prefix>:{<salt>}:pending``,
scored by the time served). A `ClickConsumer` thread in serve reads the events topic in its own
consumer group (one group for every instance, so each event is read by one), and for an event
carrying ``request_id`` that is a click (``label`` 1, or no label and an action in
``click_actions``) whose request is on record, counts one click per (request, item) (a
``SET NX`` marker, so a redelivered event counts once) in hash ``<prefix>:{<salt>}:clicks``. Its
offsets are committed only after those writes. The counters live in Redis, so every instance's
lists and clicks add up; ``/metrics`` reads them for the running plan on each scrape. The salt
in braces keeps one plan's keys in one Cluster slot; the join runs on the feature store's Redis,
standalone or Cluster (``STREAMREC_STORE__CLUSTER``), with the store's client options.

The attribution window (``click_window_s``): a list counts toward its arm's click-through, in
both its lists and its clicks, once it is settled: clicked (its first click moves it from the
pending set to ``<prefix>:{<salt>}:settled``, in the same script as the count) or served
``click_window_s`` ago (each read of the figures moves those, oldest first, in bounded steps).
Counting a list as unclicked the moment it is served made a new arm's click-through lag its
clicks; settled lists compare like with like. A click after the window still counts, on a list
already settled.

Why not the consumers: they are the feature store's writers and run in transactions with the
samples topic; the join needs none of that, and in serve it is off unless configured.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import orjson
import redis
from confluent_kafka import KafkaError, Message, TopicPartition
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import RedisClusterException

from streamrec.config import KafkaConfig, RedisStoreConfig, StreamrecConfig
from streamrec.errors import ConfigError
from streamrec.featurestore.redis_options import client_options, store_client
from streamrec.kafka.clients import make_consumer
from streamrec.snapshots.traffic import TrafficPlan

logger = logging.getLogger(__name__)

# One click per (request, item): the marker's SET NX succeeds once, then the count moves; the
# list's first click settles it (KEYS: marker, clicks, pending, settled; ARGV: ttl, field, member).
_COUNT_ONCE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
  if redis.call('ZREM', KEYS[3], ARGV[3]) == 1 then
    redis.call('HINCRBY', KEYS[4], ARGV[2], 1)
  end
  return 1
end
return 0
"""
# One list served per request id: a retry (the id again, whichever arm answers it) is the list
# already counted. KEYS: marker, served, pending; ARGV: ttl, field, member, time served.
_SERVE_ONCE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
  redis.call('EXPIRE', KEYS[3], ARGV[1])
  return 1
end
return 0
"""
# The oldest pending lists served at or before ARGV[1], at most ARGV[2] of them, settled: counted
# per field (a member is "<arm>\t<version>\t<request id>") and removed. KEYS: pending, settled.
_SETTLE = r"""
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #members == 0 then return 0 end
local counts = {}
for _, member in ipairs(members) do
  local field = string.match(member, '^(.*)\t[^\t]*$')
  counts[field] = (counts[field] or 0) + 1
end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #members - 1)
for field, n in pairs(counts) do redis.call('HINCRBY', KEYS[2], field, n) end
return #members
"""
# Lists settled by one script run: 10,000 keep Redis busy 5-14 ms at a time on the 2-core machine
# (bench/click_join.py), however long nobody read the figures.
SETTLE_STEP = 10_000
_POLL_S = 0.5  # the consumer thread's poll: how soon it sees a stop
_BATCH = 500  # events per poll, committed together after their writes


@dataclass(frozen=True)
class ArmClicks:
    """One arm's figures: lists served, lists settled (clicked, or served a window ago) and clicks.

    Its click-through is ``clicks / settled``: every click is on a settled list.
    """

    lists: int
    settled: int
    clicks: int


Client = redis.Redis | RedisCluster


class ClickJoin:
    """The served lists and clicks of each plan's arms, in Redis (standalone or Cluster)."""

    def __init__(
        self,
        connect: Callable[[], Client],
        prefix: str,
        ttl_s: int,
        click_actions: Iterable[str],
        window_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Keys under ``prefix``; a served request joinable for ``ttl_s`` seconds.

        ``connect`` makes the client when first used (a Cluster's client connects as it is made,
        to read the slots: serve then starts while its Cluster is down, as with a standalone
        Redis). An unclicked list settles ``window_s`` seconds after it was served, by ``clock``
        (seconds since the epoch: every instance's alike).
        """
        self._client: Client | None = None
        self._connect = connect
        self._scripts: dict[str, Script] = {}
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.click_actions = frozenset(click_actions)
        self.window_s = window_s
        self.clock = clock
        self.settle_step = SETTLE_STEP

    @property
    def client(self) -> Client:
        """The client, made at its first use."""
        if self._client is None:
            self._client = self._connect()
        return self._client

    def _script(self, source: str) -> Script:
        """``source`` registered on the client (its SHA1; loaded on the node that lacks it)."""
        if source not in self._scripts:
            self._scripts[source] = self.client.register_script(source)
        return self._scripts[source]

    def _key(self, salt: str, name: str) -> str:
        return f"{self.prefix}:{{{salt}}}:{name}"

    def served(self, plan: TrafficPlan, request_id: str, arm: str, version: int) -> None:
        """Record one list served to ``arm``, pending until settled (one round trip).

        A request id served again (a client's retry, or an id reused) is the list already on
        record: neither counted again nor moved to the arm that answered it this time, so its
        clicks go where its first list was counted.
        """
        field = f"{arm}\t{version}"
        # The marker sits in the plan's slot with the counters (the request's record may not).
        # A plan nobody reads any more leaves nothing behind: the pending set expires too.
        keys = [self._key(plan.salt, f"list:{request_id}"), self._key(plan.salt, "served"),
                self._key(plan.salt, "pending")]
        args: list[str | int] = [self.ttl_s, field, f"{field}\t{request_id}", repr(self.clock())]
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            pipe.set(f"{self.prefix}:req:{request_id}", f"{plan.salt}\t{field}", ex=self.ttl_s, nx=True)
            # EVALSHA itself: redis-py's Script in a pipeline asks SCRIPT EXISTS first, a second
            # round trip a list. Both commands are idempotent, so a server that lost the script
            # (restarted, flushed) gets it loaded and the pair again.
            pipe.evalsha(self._script(_SERVE_ONCE).sha, len(keys), *keys, *args)
            try:
                pipe.execute()
                return
            except redis.exceptions.NoScriptError:
                if attempt == 2:
                    raise
                self.client.script_load(_SERVE_ONCE)

    def clicked(self, event: dict[str, object]) -> bool:
        """Count ``event`` as a click of the arm its request was served by; False when it is not one.

        Not one: no ``request_id``, not a click, or a request not on record (served outside a
        plan, or longer ago than the TTL).
        """
        request_id, label = event.get("request_id"), event.get("label")
        is_click = label == 1 if label is not None else event.get("action") in self.click_actions
        if not isinstance(request_id, str | int) or isinstance(request_id, bool) or not is_click:
            return False
        record = self.client.get(f"{self.prefix}:req:{request_id}")
        if record is None:
            return False
        salt, _, field = (record.decode() if isinstance(record, bytes) else str(record)).partition("\t")
        marker = self._key(salt, f"clicked:{request_id}:{event.get('item_id')}")
        keys = [marker, self._key(salt, "clicks"), self._key(salt, "pending"), self._key(salt, "settled")]
        self._script(_COUNT_ONCE)(keys=keys, args=[self.ttl_s, field, f"{field}\t{request_id}"])
        return True

    def settle(self, plan: TrafficPlan) -> int:
        """Settle ``plan``'s lists served ``window_s`` ago or longer; how many."""
        keys = [self._key(plan.salt, "pending"), self._key(plan.salt, "settled")]
        cutoff, total = self.clock() - self.window_s, 0
        while True:
            done = int(self._script(_SETTLE)(keys=keys, args=[repr(cutoff), self.settle_step]))
            total += done
            if done < self.settle_step:
                return total

    def figures(self, plan: TrafficPlan) -> dict[tuple[str, str], ArmClicks]:
        """(arm, version) -> the figures of ``plan``'s arms, every instance's together, settled first."""
        self.settle(plan)
        pipe = self.client.pipeline(transaction=False)
        for name in ("served", "settled", "clicks"):
            pipe.hgetall(self._key(plan.salt, name))
        served, settled, clicks = pipe.execute()
        out = {}
        for field in set(served) | set(settled) | set(clicks):
            arm, _, version = (field.decode() if isinstance(field, bytes) else field).partition("\t")
            counts = (int(served.get(field, 0)), int(settled.get(field, 0)), int(clicks.get(field, 0)))
            out[(arm, f"v{int(version):06d}")] = ArmClicks(*counts)
        return out


class ClickCollector(Collector):
    """``streamrec_serving_arm_lists``, ``_arm_settled_lists`` and ``_arm_clicks`` of the running plan.

    Read on scrape.
    """

    def __init__(self, join: ClickJoin, plan: Callable[[], TrafficPlan | None]) -> None:
        """Report ``join``'s figures for the plan ``plan()`` routes by."""
        self.join = join
        self.plan = plan

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The three families (empty without a plan or when Redis does not answer)."""
        labels = ["arm", "version"]
        lists = GaugeMetricFamily(
            "streamrec_serving_arm_lists",
            "Lists served during the running canary or A/B test, by arm and version (all instances)",
            labels=labels,
        )
        settled = GaugeMetricFamily(
            "streamrec_serving_arm_settled_lists",
            "Of those lists, the ones clicked or served STREAMREC_SERVING__CLICK_WINDOW_S ago: "
            "the click-through's denominator",
            labels=labels,
        )
        clicks = GaugeMetricFamily(
            "streamrec_serving_arm_clicks",
            "Clicks joined to those lists by request id, by arm and version "
            "(divided by the settled lists: the click-through)",
            labels=labels,
        )
        plan = self.plan()
        if plan is not None:
            try:
                for (arm, version), figures in sorted(self.join.figures(plan).items()):
                    lists.add_metric([arm, version], figures.lists)
                    settled.add_metric([arm, version], figures.settled)
                    clicks.add_metric([arm, version], figures.clicks)
            except (redis.RedisError, RedisClusterException) as exc:
                logger.warning("cannot read click-through figures error=%s", exc)
        yield lists
        yield settled
        yield clicks


class ClickConsumer:
    """Reads the events topic in serve's own group and joins clicks (`ClickJoin.clicked`)."""

    def __init__(self, join: ClickJoin, kafka: KafkaConfig, group: str) -> None:
        """Consume ``kafka.events_topic`` as ``group``; `start` runs it on a thread."""
        self.join = join
        self.consumer = make_consumer(kafka, group, **{"enable.partition.eof": False})
        self.consumer.subscribe([kafka.events_topic])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="click-join", daemon=True)
        self.joined = 0

    def start(self) -> ClickConsumer:
        """Run on a thread until `stop`."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling and leave the group (once; again is a no-op)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()
        logger.info("click join stopped joined=%d", self.joined)

    def _run(self) -> None:
        while not self._stop.is_set():
            messages = self.consumer.consume(_BATCH, _POLL_S)
            try:
                for message in messages:
                    self._one(message)
                done = _positions(messages, after=True)
                if done:  # after their writes: a crash before this re-reads them, counted once
                    self.consumer.commit(offsets=done, asynchronous=False)
            except Exception:  # Redis away, say: logged, the batch read again after a pause
                logger.exception("click join failed; reading the batch again")
                self._rewind(messages)
                self._stop.wait(1.0)

    def _rewind(self, messages: list[Message]) -> None:
        for position in _positions(messages, after=False):
            self.consumer.seek(position)

    def _one(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                logger.warning("click join consumer error=%s", error)
            return
        try:
            event = orjson.loads(message.value() or b"")
        except orjson.JSONDecodeError:
            return  # the consumers dead-letter it; for the join it is no click
        if isinstance(event, dict) and self.join.clicked(event):
            self.joined += 1


def _positions(messages: list[Message], after: bool) -> list[TopicPartition]:
    """Per partition, the offset after the batch's last record (``after``) or of its first."""
    found: dict[tuple[str, int], int] = {}
    for m in messages:
        topic, partition, offset = m.topic(), m.partition(), m.offset()
        if m.error() is None and topic is not None and partition is not None and offset is not None:
            key = (topic, partition)
            found[key] = offset + 1 if after else found.get(key, offset)
    return [TopicPartition(topic, partition, offset) for (topic, partition), offset in found.items()]


def start_click_join(cfg: StreamrecConfig) -> tuple[ClickJoin, ClickConsumer]:
    """The join on the feature store's Redis and its consumer, started (`streamrec serve`).

    Raises:
        ConfigError: the feature store is not Redis.
    """
    store = cfg.store
    if not isinstance(store, RedisStoreConfig):
        raise ConfigError(
            "STREAMREC_SERVING__CLICK_JOIN needs the Redis feature store (STREAMREC_STORE__TYPE=redis)"
        )
    options = client_options(store)  # the store's, its CLIENT too
    serving = cfg.serving
    join = ClickJoin(
        lambda: store_client(store, options), f"{store.key_prefix}:ab",
        serving.click_ttl_s, serving.click_actions, serving.click_window_s,
    )
    return join, ClickConsumer(join, cfg.kafka, serving.click_group).start()

