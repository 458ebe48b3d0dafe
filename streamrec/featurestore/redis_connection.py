"""A Redis feature store's connection: its client, scripts and pipelined round trips.

The client (a Cluster's made on first use), the scripts loaded on every primary and loaded
again when Redis lost them, one pipelined round trip whose replies are read as they come,
and Redis's failures told apart as the store's: refused (the settings), unavailable for now
(an outage), never reached (a wrong URL), or failed.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.cluster import RedisCluster

from streamrec.config import RedisStoreConfig, redact_url
from streamrec.errors import FeatureStoreError, FeatureStoreUnavailable, FeatureStoreUnreachable
from streamrec.featurestore.redis_options import client_options, store_client
from streamrec.featurestore.redis_partitions import ADVANCE_LUA, CLAIM_LUA
from streamrec.featurestore.redis_replies import Replies
from streamrec.featurestore.redis_scripts import FIRST_SEEN_LUA, SEQUENCE_LUA
from streamrec.featurestore.redis_server import (
    COMPACT_DEFAULTS,
    FEATURED_MEMBER_BYTES,
    NO_ANSWER,
    PASSING_REPLIES,
    REFUSED,
    UNAVAILABLE,
    compact_limits,
    raise_member_limit,
)

T = TypeVar("T")


class RedisConnection:
    """The Redis of one `RedisFeatureStore`, standalone or Cluster."""

    def __init__(
        self, cfg: RedisStoreConfig, length: int, featured: bool, client: redis.Redis | None = None
    ) -> None:
        """Connect to ``cfg.url`` (a Cluster when ``cfg.cluster``), or use ``client``.

        ``length`` is the sequences' cap and ``featured`` whether their entries carry
        behaviour features (longer members): the compact sorted-set limits follow both.
        A Cluster client connects as it is made (to read the slots), so it is made when
        first used: a consumer started before its Cluster is up then waits for it in
        `RedisFeatureStore.attach`, as for a standalone Redis.
        """
        self._prefix = cfg.key_prefix
        self._length = length
        self._featured = featured
        self._cfg, self._url = cfg, cfg.url
        self._options = client_options(cfg)
        self.answered = False  # whether Redis answered anything since this connection was made
        self._user = str(self._options.get("username") or urlsplit(cfg.url).username or "default")
        self._client: redis.Redis | RedisCluster | None = client
        self._owns_client = client is None  # a client given is its caller's to close
        self._shas: tuple[str, ...] | None = None  # loaded on first use, again after NOSCRIPT
        self.limits = COMPACT_DEFAULTS  # Redis's compact sorted-set limits, read with the scripts

    @property
    def client(self) -> redis.Redis | RedisCluster:
        """The client; a Cluster's made on first use (see `__init__`).

        Raises:
            FeatureStoreUnavailable: no node of the Cluster answered.
            FeatureStoreError: the nodes answered, but not as a Cluster.
        """
        if self._client is None:
            try:
                self._client = store_client(self._cfg, self._options, decode_responses=True)
            except redis.RedisError as exc:  # no node answered, or refused, or not as a Cluster
                raise self.translated(exc) from exc
        return self._client

    def close(self) -> None:
        """Close the client this connection made, its pool's connections with it; again, nothing.

        A client given to it is left open. Used again, the connection makes a new client.
        """
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            client.close()

    def scripts(self, reload: bool = False) -> tuple[str, ...]:
        """The SHA1s of the scripts (sequences, first seen, claim, advance), loaded on every primary."""
        if self._shas is None or reload:
            if self._featured:  # longer entries: keep the sequences compact
                raise_member_limit(self.client, FEATURED_MEMBER_BYTES)
            self.limits = compact_limits(self.client, self._length)
            self._shas = tuple(
                self.client.script_load(script)
                for script in (SEQUENCE_LUA, FIRST_SEEN_LUA, CLAIM_LUA, ADVANCE_LUA)
            )
        return self._shas

    def translated(self, exc: redis.RedisError) -> FeatureStoreError:
        """A Redis failure as the store's.

        Refused (the settings), unavailable for now, or failed.
        """
        if isinstance(exc, REFUSED):
            return FeatureStoreError(
                f"redis refused user {self._user!r}: {exc} (check the user and password in "
                "STREAMREC_STORE__URL; the store needs @read, @write, @scripting and @fast on "
                f"the keys matching '{self._prefix}:*')"
            )
        if _untrusted_certificate(exc):  # no retry mends it: not an outage, nor a Redis unreached
            return FeatureStoreError(
                f"redis at {redact_url(self._url)} has a TLS certificate this client does not trust: "
                f"{exc} (give the CA that signed it as STREAMREC_STORE__CLIENT='{{\"ssl_ca_certs\": "
                '"/path/to/ca.pem"}\')'
            )
        if isinstance(exc, NO_ANSWER) and not isinstance(exc, redis.exceptions.BusyLoadingError):
            return self.unavailable(exc)
        self.answered = True  # anything else is a reply
        if isinstance(exc, UNAVAILABLE) or str(exc).startswith(PASSING_REPLIES):
            return FeatureStoreUnavailable(f"redis unavailable: {exc}")
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            return FeatureStoreError(
                f"redis is out of memory: {exc} (raise its maxmemory, or shorten how long "
                "sequences are kept, STREAMREC_STORE__TTL_S; the batch was not committed and "
                "is redone on restart)"
            )
        return FeatureStoreError(f"redis failed: {exc}")

    def unavailable(self, exc: Exception) -> FeatureStoreUnavailable:
        """No answer: an outage once Redis has answered, else a Redis never reached."""
        if self.answered:
            return FeatureStoreUnavailable(f"redis unavailable: {exc}")
        return FeatureStoreUnreachable(
            f"redis at {redact_url(self._url)} did not answer (STREAMREC_STORE__URL, --redis-url): {exc}"
        )

    def next_reply(self, replies: Iterator[Any]) -> Any:
        """The next reply of a round trip already under way, its failures as the store's."""
        try:
            return next(replies)
        except redis.exceptions.NoScriptError as exc:  # lost after the first calls ran
            self._shas = None  # loaded again when the batch is redone
            raise FeatureStoreUnavailable(f"redis lost the scripts mid-batch: {exc}") from exc
        except redis.RedisError as exc:
            raise self.translated(exc) from exc

    def run(
        self,
        commands: Callable[[tuple[str, ...]], Iterable[tuple[Any, ...]]],
        read: Callable[[Iterator[Any]], T],
    ) -> T:
        """One pipelined round trip of ``commands(script shas)``; each reply to ``read`` (`open`)."""
        result, replies = self.open(commands, read)
        replies.close()
        return result

    def open(
        self,
        commands: Callable[[tuple[str, ...]], Iterable[tuple[Any, ...]]],
        head: Callable[[Iterator[Any]], T],
        meanwhile: Callable[[], None] | None = None,
    ) -> tuple[T, Replies]:
        """Send ``commands(script shas)`` in one pipelined round trip and hand the first replies to ``head``.

        All over again with the scripts reloaded if Redis lost them (a restart or failover;
        every call here can safely run again). Returns what ``head`` made and the replies after
        its, to be read or closed. ``meanwhile`` runs once, after the commands went out.

        On a standalone Redis each command goes out as soon as it is made and each reply is
        read when asked for, while Redis still runs the later ones: packing and parsing
        overlap Redis's work.
        """
        once = [meanwhile] if meanwhile is not None else []
        for reload in (False, True):
            replies: Replies | None = None
            try:
                replies = self._send(commands(self.scripts(reload)), once)
                return head(replies), replies
            except BaseException as exc:
                if replies is not None:
                    replies.close()
                if isinstance(exc, redis.exceptions.NoScriptError) and not reload:
                    continue
                if isinstance(exc, redis.RedisError):
                    raise self.translated(exc) from exc
                raise
        raise AssertionError("unreachable: the second pass returns or raises")

    def _send(self, commands: Iterable[tuple[Any, ...]], meanwhile: list[Callable[[], None]]) -> Replies:
        if isinstance(self.client, RedisCluster):  # the cluster client routes a pipeline by slot
            pipe = self.client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            while meanwhile:  # it sends only in execute(): nothing to overlap with
                meanwhile.pop()()
            return Replies(ready=pipe.execute())
        pool = self.client.connection_pool
        replies = Replies(pool)
        try:
            for command in commands:
                replies.send(command)
            while meanwhile:  # Redis is busy with the commands now
                meanwhile.pop()()
        except BaseException:
            replies.close()
            raise
        if not replies.left:  # nothing sent: no reply will give the connection back
            replies.close()
        return replies


def _untrusted_certificate(exc: BaseException) -> bool:
    """Whether ``exc`` comes of a TLS certificate the client did not verify (in its causes)."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain of causes is short; never follow a cycle for ever
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
