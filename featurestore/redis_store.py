"""Redis feature store: one sorted set per user, scored by event time.

Key ``<prefix>:seq:{<user_id>}``: the hash tag puts every key of a user in one Cluster slot.
Member: ``event_id \\t item \\t category \\t action`` (see :class:`Behaviour`), so an event is
stored once however often it is redelivered. A batch is one pipelined round trip: ZADD per
user, one ZREVRANGEBYSCORE per history asked for, then trim to the cap and refresh the TTL;
and per item ``<prefix>:item:{<item_id>}`` holds the first time it was seen (SET NX, then GET).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import redis

from streamrec.config import RedisConfig
from streamrec.errors import FeatureStoreError
from streamrec.events import Event
from streamrec.featurestore.base import Behaviour, StoreUpdate, earliest_per_item


class RedisFeatureStore:
    """Length-capped, TTL'd behaviour sequences in Redis (standalone or Cluster-safe keys)."""

    def __init__(self, cfg: RedisConfig, length: int, client: redis.Redis | None = None) -> None:
        self.length = length
        self._prefix = cfg.key_prefix
        self._ttl_ms = cfg.ttl_s * 1000
        self._redis = client or redis.Redis.from_url(cfg.url, decode_responses=True, **cfg.client)

    def key(self, user_id: str) -> str:
        """The sorted-set key of a user's sequence."""
        return f"{self._prefix}:seq:{{{user_id}}}"

    def item_key(self, item_id: str) -> str:
        """The key holding an item's first-seen time."""
        return f"{self._prefix}:item:{{{item_id}}}"

    def update(self, events: Sequence[Event], before: Sequence[Event]) -> StoreUpdate:
        """See :meth:`FeatureStore.update`."""
        by_user: dict[str, dict[str, int]] = defaultdict(dict)
        for event in events:
            by_user[event.user_id][Behaviour.of(event).member()] = event.ts
        pipe = self._redis.pipeline(transaction=False)
        for user_id, members in by_user.items():
            pipe.zadd(self.key(user_id), members)
        for event in before:
            # "(" makes the bound exclusive: strictly earlier behaviours only.
            pipe.zrevrangebyscore(
                self.key(event.user_id), f"({event.ts}", "-inf",
                start=0, num=self.length, withscores=True,
            )
        for user_id in by_user:
            pipe.zremrangebyrank(self.key(user_id), 0, -self.length - 1)
            pipe.pexpire(self.key(user_id), self._ttl_ms)
        earliest = earliest_per_item(events)
        for item_id, ts in earliest.items():
            pipe.set(self.item_key(item_id), ts, nx=True, px=self._ttl_ms)
            pipe.get(self.item_key(item_id))
        try:
            replies = pipe.execute()
        except redis.RedisError as exc:
            raise FeatureStoreError(f"redis pipeline failed: {exc}") from exc
        reads = replies[len(by_user) : len(by_user) + len(before)]
        histories = [
            [Behaviour.from_member(m, int(ts)) for m, ts in reversed(rows)] for rows in reads
        ]
        first = replies[len(replies) - 2 * len(earliest) + 1 :: 2] if earliest else []
        return StoreUpdate(histories, {item: int(ts) for item, ts in zip(earliest, first, strict=True)})

    def sequence(self, user_id: str) -> list[Behaviour]:
        """See :meth:`FeatureStore.sequence`."""
        try:
            rows = self._redis.zrange(self.key(user_id), 0, -1, withscores=True)
        except redis.RedisError as exc:
            raise FeatureStoreError(f"redis read failed: {exc}") from exc
        return [Behaviour.from_member(m, int(ts)) for m, ts in rows]

    def ping(self) -> None:
        """Raise :class:`FeatureStoreError` unless Redis answers."""
        try:
            self._redis.ping()
        except redis.RedisError as exc:
            raise FeatureStoreError(f"redis unreachable: {exc}") from exc
