"""The replies of one pipelined round trip to Redis, read as they come."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import hiredis
from redis.connection import Connection, ConnectionPool

from streamrec.errors import FeatureStoreUnavailable


class Replies:
    """The replies of one pipelined round trip, read one at a time, and the connection they come on.

    Given back to the pool once every reply is read, dropped when closed with replies unread
    (they would be out of step for the connection's next user).
    """

    def __init__(self, pool: ConnectionPool | None = None, ready: list[Any] | None = None) -> None:
        """Replies to come on a connection from ``pool``, or ready ones.

        Replies to come on a connection taken from ``pool``, or ``ready`` (a Cluster
        pipeline's, read at once).
        """
        self._pool = pool
        self._conn: Connection | None = None if pool is None else pool.get_connection()
        self._ready = iter(ready or [])
        self.left = len(ready or [])

    def send(self, command: tuple[Any, ...]) -> None:
        """Send one more command on the connection."""
        if self._conn is None:
            raise ValueError("no connection to send on")
        # hiredis packs in C; redis-py first walks every argument in Python (~2% of a
        # consumer's time, at hundreds of arguments a call)
        self._conn.send_packed_command([hiredis.pack_command(command)])
        self.left += 1

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if not self.left:
            raise StopIteration
        if self._pool is None:
            self.left -= 1
            return next(self._ready)
        if self._conn is None:
            raise FeatureStoreUnavailable("the redis connection of this round trip was given up")
        try:
            reply = self._conn.read_response()
        except BaseException:
            self.close()
            raise
        self.left -= 1
        if not self.left:
            self.close()
        return reply

    def close(self) -> None:
        """Give the connection back, dropped if replies are left unread."""
        conn, self._conn = self._conn, None
        if conn is not None and self._pool is not None:
            if self.left:
                conn.disconnect()
            self._pool.release(conn)
