"""Event-time lateness: a watermark per partition, and the events that fall behind it.

Each partition's watermark is the newest event time seen on it minus the allowed lateness.
An event older than its partition's watermark is *late*: the learner has long trained on
what came after it, so a sample of it would be scored and learnt by a model that has seen
its future, and its negatives would come from pools that no longer cover its time. The
consumers either dead-letter it (reason ``late event ...``) or keep it in its user's
sequence without emitting samples (``ConsumerConfig.late_events``).

Events are judged in the order their partition delivered them (offset order), before a
batch is sorted by event time, so the decision depends only on the partition's earlier
records. The watermarks are a batch's in-memory state like the negative pools: staged in
the batch's result and kept only when it commits, so a batch redone after an abort decides
exactly as a clean run. They are also stored with each partition's state in the feature
store, as of the offset each batch ends at (`streamrec.featurestore.partitions`): after
a restart or a rebalance a partition's watermark resumes where its committed offset left it.
"""

from __future__ import annotations

from streamrec.kafka.records import Partition


class Watermarks:
    """The newest event time seen on each partition, and the lateness allowed behind it.

    ``allowed_ms`` None judges nothing late; 0 judges late any event older than one its
    partition delivered before it.
    """

    def __init__(self, allowed_ms: int | None, newest: dict[Partition, int] | None = None) -> None:
        """Allow ``allowed_ms`` of lateness; ``newest`` is the event time seen per partition."""
        self.allowed_ms = allowed_ms
        self._newest: dict[Partition, int] = dict(newest or {})

    def copy(self) -> Watermarks:
        """An independent copy: a batch judges with it, and it replaces this one on commit."""
        return Watermarks(self.allowed_ms, self._newest)

    def restore(self, key: Partition, newest: int | None) -> None:
        """Resume ``key`` at the newest event time stored for it (None: start afresh)."""
        if newest is None:
            self._newest.pop(key, None)
        else:
            self._newest[key] = newest

    def watermark(self, key: Partition) -> int | None:
        """Events older than this on ``key`` are late.

        None before its first event, or when nothing is judged late.
        """
        newest = self._newest.get(key)
        return None if newest is None or self.allowed_ms is None else newest - self.allowed_ms

    def newest(self, key: Partition) -> int | None:
        """The newest event time seen on ``key``."""
        return self._newest.get(key)

    def judge(self, key: Partition, ts: int) -> int | None:
        """Judge the next event of partition ``key``.

        How many ms it is behind the newest event time seen there when it is late, else None
        (and it may advance the watermark).
        """
        newest = self._newest.get(key)
        if newest is None or ts > newest:
            self._newest[key] = ts
            return None
        allowed = self.allowed_ms
        if allowed is not None and ts < newest - allowed:
            return newest - ts
        return None
