"""Where a learner runner's training stands: the Kafka positions trained up to, kept in its snapshots.

`RunnerProgress` is the part of `streamrec.learner.runner.LearnerRunner` that keeps its
progress durable. Offsets move with the model: each partition's position is the next offset
to train, advanced past what a micro-batch trained or dead-lettered (never past a record
still waiting); a snapshot holds the learner's state with those positions, and they are
committed to the consumer group only after it is durable. At start the newest valid snapshot
is restored and its positions taken up, after a check that the topic is still the one they are
offsets in (its topic id, kept in each snapshot) and still holds the samples they point at.
Snapshot requests (``streamrec snapshot create``) are answered here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaException, TopicPartition

from streamrec.config import StreamrecConfig
from streamrec.errors import SamplesExpired, SamplesTopicRecreated, SnapshotError
from streamrec.features.schema import FeatureSchema
from streamrec.kafka.records import Partition, Position
from streamrec.kafka.source import RecordSource
from streamrec.kafka.topics import expired_positions, topic_id, topic_partitions
from streamrec.learner.base import Learner
from streamrec.learner.reports import LearnerStats
from streamrec.learner.snapshotting import group_state, require_finite, restore, snapshot_config
from streamrec.snapshots.store import SnapshotManifest, SnapshotStore
from streamrec.wording import plural

logger = logging.getLogger(__name__)

# A watermark query at start: a broker answers in milliseconds.
_QUERY_TIMEOUT_S = 10.0


class RunnerProgress:
    """The positions and snapshots of a `LearnerRunner` (which sets every attribute below)."""

    _cfg: StreamrecConfig
    _schema: FeatureSchema
    _source: RecordSource
    _closed: bool
    _on_snapshot: Callable[[SnapshotManifest], None] | None
    learner: Learner
    snapshots: SnapshotStore
    stats: LearnerStats
    #: The next offset to train per partition: moves with the model, read at assignment.
    positions: dict[Partition, int]
    _snapshotted_at: int  # micro_batches at the last snapshot
    _snapshotted_positions: dict[Partition, int]  # positions at the last one
    _snapshotted_version: int | None  # the version written or restored last
    #: The snapshot restored at start (None: started afresh): the promotion gate takes it up.
    resumed: SnapshotManifest | None = None
    _resumed_topic_id: str | None = None  # the samples topic's id in the snapshot restored
    _topic_id: str | None = None  # the samples topic's id when the run began

    def _resume(self) -> None:
        """Restore the newest valid snapshot, if any, and take up its counts and positions."""
        manifest = restore(self._cfg, self._schema, self.learner, self.snapshots)
        if manifest is None:
            return
        self.stats.micro_batches = self._snapshotted_at = manifest.micro_batches
        self.stats.samples_trained = manifest.samples_trained
        self.stats.newest_event_ms = manifest.newest_event_ms
        self.positions.update({p.key: p.offset for p in manifest.positions})
        self._snapshotted_positions = dict(self.positions)
        self._snapshotted_version = manifest.version
        self._resumed_topic_id = manifest.samples_topic_id
        self.resumed = manifest

    def _check_positions(self) -> None:
        """Refuse to resume in a samples topic created again, or at samples it no longer holds.

        Each is an error unless allowed. Without the checks the consumer would resume at the
        snapshot's offsets in the new topic, or jump to the earliest offset left, without a word.
        """
        self._check_topic()
        self._check_retention()

    def _check_topic(self) -> None:
        """Refuse a samples topic not the snapshot's (or read it from its start, if allowed).

        Created again since the snapshot: a new topic id says so (brokers without ids, before
        Kafka 2.8, are not checked); another topic (``STREAMREC_KAFKA__SAMPLES_TOPIC`` changed):
        the snapshot's positions name theirs. Its offsets are not the snapshot's positions';
        allowed (``resume_on_new_topic``), every partition of it is read from its first sample.
        """
        topic = self._cfg.kafka.samples_topic
        self._topic_id = topic_id(self._cfg.kafka, topic, _QUERY_TIMEOUT_S)
        renamed = ", ".join(sorted({key.topic for key in self.positions} - {topic}))
        if not renamed and (self._resumed_topic_id in (None, self._topic_id) or self._topic_id is None):
            return
        if renamed:
            why = f"its positions are in {renamed}"
            what = (f"the snapshot's positions are offsets in the samples topic {renamed}, not {topic} "
                    "(STREAMREC_KAFKA__SAMPLES_TOPIC changed since), so they")
        else:
            why = f"topic id {self._resumed_topic_id} in the snapshot, now {self._topic_id}"
            what = (f"the samples topic {topic} was created again since the snapshot ({why}): its offsets "
                    "start over, so the snapshot's positions")
        if not self._cfg.learner.resume_on_new_topic:
            raise SamplesTopicRecreated(
                f"{what} do not point at its samples (set STREAMREC_LEARNER__RESUME_ON_NEW_TOPIC=true to "
                "train this model on from the topic's first sample)"
            )
        logger.warning("the samples topic was %s since the snapshot (%s): training on from its first sample "
                       "topic=%s", "renamed" if renamed else "created again", why, topic)
        consumer = self._source.consumer
        self.positions.clear()
        for p in topic_partitions(consumer, topic, _QUERY_TIMEOUT_S):
            low, _ = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=_QUERY_TIMEOUT_S)
            self.positions[Partition(topic, p)] = low

    def _check_retention(self) -> None:
        """Refuse to resume at samples the topic no longer holds (or skip them, if allowed)."""
        consumer = self._source.consumer
        earliest = {
            key: consumer.get_watermark_offsets(TopicPartition(*key), timeout=_QUERY_TIMEOUT_S)[0]
            for key in self.positions
        }
        gaps = expired_positions(self.positions, earliest)
        if not gaps:
            return
        lost = sum(low - offset for offset, low in gaps.values())
        where = ", ".join(f"{key} at {offset} (it starts at {low})" for key, (offset, low) in gaps.items())
        if not self._cfg.learner.allow_sample_gaps:
            raise SamplesExpired(
                f"the snapshot resumes at samples the topic no longer holds: {where}; "
                f"{plural(lost, 'sample')} {'was' if lost == 1 else 'were'} never trained "
                "(raise STREAMREC_KAFKA__SAMPLES_RETENTION_MS, or set "
                "STREAMREC_LEARNER__ALLOW_SAMPLE_GAPS=true to skip them)"
            )
        logger.warning("skipping expired samples count=%d where=%s", lost, where)
        self.positions.update({key: low for key, (_, low) in gaps.items()})

    def _start_every_partition(self) -> None:
        """Give every partition of the samples topic a position.

        Give every partition of the samples topic a position, so that each assignment of
        it starts where this learner left off: from the snapshot, else the group's committed
        offset, else its first sample. Without one, a partition handed back after a rebalance
        would start at whatever another member of the group committed meanwhile. Starting
        without a snapshot at positions the group committed is said in a warning.
        """
        if self.resumed is None and self._source.has_committed_offsets(_QUERY_TIMEOUT_S):
            # a mistyped or emptied snapshot directory: the group's training would be left behind
            logger.warning(
                "no snapshot in %s, while consumer group %s committed positions in %s: a new model "
                "starts training at them, without what the group trained before; if its snapshots "
                "are in another directory, stop and set STREAMREC_LEARNER__SNAPSHOT_DIR "
                "(--snapshot-dir)", self.snapshots.root, self._cfg.learner.group_id,
                self._cfg.kafka.samples_topic,
            )
        found = self._source.start_positions(self.positions, _QUERY_TIMEOUT_S)
        self.positions.update(found)
        self._snapshotted_positions.update(found)  # a place to start, not progress to save

    def _unsnapshotted(self) -> bool:
        """Whether training or positions (past dead letters, say) moved since the last snapshot."""
        return (
            self.stats.micro_batches > self._snapshotted_at
            or self.positions != self._snapshotted_positions
        )

    def _advance_positions(self, ends: Mapping[Partition, int], assignments: int) -> None:
        """Move each partition's position past what is done.

        Move each partition's position to ``ends``, past what was trained or dead-lettered
        (`advance_ends`), but never past a record still waiting (event-time order can put a
        lower offset there).

        ``assignments`` is the source's count when the micro-batch began: a rebalance since
        started the new assignment from the positions before it, so read on from these.
        """
        for key, end in ends.items():
            self.positions[key] = max(self.positions.get(key, 0), end)
        for key, offset in self._source.unread_floor().items():
            if self.positions.get(key, 0) > offset:
                self.positions[key] = offset
        if self._source.assignments != assignments:
            self._source.seek(self.positions)

    def _require_same_topic(self) -> None:
        """Raise `SamplesTopicRecreated` if the samples topic was created again since the run began.

        The positions would then mix offsets of two topics: nothing trained since the last
        snapshot is recorded, and a restart resumes from it (`_check_positions` decides).
        """
        if self._topic_id is None:
            return
        topic = self._cfg.kafka.samples_topic
        now = topic_id(self._cfg.kafka, topic, _QUERY_TIMEOUT_S)
        if now != self._topic_id:
            raise SamplesTopicRecreated(
                f"the samples topic {topic} was created again while the learner ran (topic id "
                f"{self._topic_id}, now {now}): what it trained since the last snapshot is not "
                "recorded; restart it to resume from that snapshot"
            )

    def _serve_requests(self) -> None:
        for request_id in self.snapshots.requests.pending():
            if self._snapshotted_version is not None and not self._unsnapshotted():
                # Nothing trained since the last version: it answers; an empty delta would not.
                self.snapshots.requests.answer(request_id, self._snapshotted_version)
                logger.info("snapshot request answered with version=%d: nothing trained since",
                            self._snapshotted_version)
            else:
                self.snapshot(request_id)
            self.snapshots.requests.done(request_id)

    def snapshot(self, request_id: str | None = None) -> SnapshotManifest:
        """Write a snapshot of the model and positions, then commit the positions to Kafka.

        Raises:
            SnapshotWriteError: the snapshot could not be written (nothing is left behind).
            NonFiniteWeights: a weight is NaN or infinite; nothing is written.
        """
        if self._closed:
            raise RuntimeError("snapshot() on a closed LearnerRunner: it no longer holds the lock")
        self._require_same_topic()
        arrays = self.learner.state_arrays()
        require_finite(arrays, self.stats.micro_batches)
        positions = tuple(Position(*key, offset) for key, offset in sorted(self.positions.items()))
        manifest = self.snapshots.write(
            group_state(arrays),
            micro_batches=self.stats.micro_batches,
            samples_trained=self.stats.samples_trained,
            positions=positions,
            metrics=self.stats.last_metrics,
            config=snapshot_config(self._cfg, self._schema),
            request_id=request_id,
            newest_event_ms=self.stats.newest_event_ms,
            samples_topic_id=self._topic_id,
        )
        self._snapshotted_at = self.stats.micro_batches
        self._snapshotted_positions = dict(self.positions)
        self._snapshotted_version = manifest.version
        if positions:
            try:
                self._source.consumer.commit(
                    offsets=[p.to_kafka() for p in positions], asynchronous=False
                )
            except KafkaException as exc:
                # The snapshot is the source of truth for positions; the group's committed
                # offsets only serve lag monitoring and learners started without snapshots.
                logger.warning("offset commit after snapshot failed error=%s", exc)
        logger.info(
            "snapshot version=%d micro_batches=%d samples_trained=%d path=%s",
            manifest.version, manifest.micro_batches, manifest.samples_trained,
            self.snapshots.path(manifest.version),
        )
        if self._cfg.learner.keep_snapshots:
            try:
                self.snapshots.prune(self._cfg.learner.keep_snapshots)
            except (SnapshotError, OSError) as exc:  # housekeeping: the snapshot is durable
                logger.error("snapshot retention failed, tried again after the next snapshot error=%s", exc)
        if self._on_snapshot is not None:
            self._on_snapshot(manifest)
        return manifest


