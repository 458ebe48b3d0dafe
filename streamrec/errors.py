"""The one error root. Every error streamrec raises on purpose derives from StreamrecError.

Each subclass docstring says what the operator should do about it.
"""

from __future__ import annotations

from collections.abc import Callable

#: Why an empty path is refused, as a flag (`streamrec.cli.options.path_given`) or a setting
#: (`streamrec.config.section.NonEmptyPath`): a `Path` reads ``''`` as the working directory.
EMPTY_PATH = "it is empty: name a path ('.' for the working directory)"


def a_kind(value: object) -> str:
    """The type of ``value`` with its article, for a TypeError: ``a str``, ``an Event``.

    Examples:
        >>> a_kind(5), a_kind(None)
        ('an int', 'a NoneType')
    """
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


class StreamrecError(Exception):
    """Base of every streamrec error; the CLI maps it to a one-line message and exit code 1."""


class ConfigError(StreamrecError):
    """The configuration is invalid: fix the named setting (flag, STREAMREC_* env var or TOML)."""


class FieldError(ConfigError):
    """A value of a spec (a generated stream's shape) is out of range: change the value named.

    The message names each field as ``<Spec>.<field>``; `naming` says it again with the
    field named as its caller knows it (a command's flag, a source string's key).
    """

    def __init__(self, owner: str, say: Callable[[Callable[[str], str]], str]) -> None:
        """The message ``say`` writes, given how to name a field (here ``owner.<field>``)."""
        super().__init__(say(lambda field: f"{owner}.{field}"))
        self._say = say

    def naming(self, name: Callable[[str], str]) -> str:
        """The message with each field named by ``name``."""
        return self._say(name)

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str]]:
        """Pickled (out of a process) as the plain `ConfigError` of its message."""
        return ConfigError, (str(self),)


class SchemaChange(ConfigError):
    """A record (sample, snapshot, export) was written under a feature schema this one cannot read.

    Declare the feature as it was, or start afresh; the message says which feature.
    """


class ServiceError(StreamrecError):
    """A local service (broker or Redis) could not start or is unreachable: read the message."""


class InvalidEvent(StreamrecError):
    """An event broke the event contract; it is routed to the dead-letter topic, never raised out."""


class DatasetError(StreamrecError):
    """A dataset file could not be read: check its path and format."""


class OutputError(StreamrecError):
    """An output file (a report, a dump) could not be written: check its path, permissions and free space."""


class BrokerError(StreamrecError):
    """Kafka failed: check the broker is up at the configured address and the topics exist."""


class DeliveryError(BrokerError):
    """Kafka did not acknowledge a produced record: check the broker and the topic, then resend."""


class ConsumeError(BrokerError):
    """Consuming failed for good (a fatal client error): check the broker and the group."""


class FeatureStoreError(StreamrecError):
    """The feature store (Redis) failed: check it is reachable at the configured URL."""


class SnapshotError(StreamrecError):
    """A snapshot could not be written or read: check the snapshot directory and its files."""


class SnapshotInUse(SnapshotError):
    """Another learner holds the snapshot directory.

    Stop it, or give this learner its own snapshot directory and group.
    """


class SnapshotDirError(SnapshotError):
    """The snapshot directory is unusable (not a directory, not writable, too little free space).

    Fix the named path or point --snapshot-dir elsewhere, then start again.
    """


class SnapshotWriteError(SnapshotError):
    """A snapshot could not be written (disk full, permissions).

    Fix the named cause and restart; the learner resumes from its last snapshot.
    """


class InvalidSnapshot(SnapshotError):
    """A snapshot version failed its checks and is skipped.

    Delete it, or restore it from a backup if it is the one you need.
    """


class LaterSnapshot(InvalidSnapshot):
    """A snapshot version of a form a later streamrec release wrote, which this one cannot read.

    Run the release that wrote it, or start afresh in a new snapshot directory; a learner does
    not skip it (resuming an older version would drop what it trained).
    """


class NotExportable(SnapshotError):
    """The snapshot's learner cannot be exported for serving (it has no exporter).

    Training and snapshots work without one; to serve it, give its class an
    ``export_for_serving(directory, version)`` method that writes its model and ``contract.json``.
    """


class NotServable(SnapshotError):
    """An export is not DIN's, and ``streamrec serve`` and the gate score DIN's exports only.

    Score it as its own ``contract.json`` says, outside streamrec's server.
    """


class InvalidSample(StreamrecError):
    """A training sample broke the sample contract.

    The learner routes it to the samples dead-letter topic and trains on the rest, never raised
    out.
    """


class LearnerContractError(StreamrecError):
    """The learner (``STREAMREC_MODEL__LEARNER``) returned what the learner contract rules out.

    Scores not float [B], finite and within [0, 1], or ``learn_many`` not a ``TrainResult``: fix
    the class named; ``streamrec.learner.check_learner`` finds such defects before a run.
    """


class LearnerFailed(StreamrecError):
    """The learner (``STREAMREC_MODEL__LEARNER``) raised inside one of its own methods.

    The message names the learner, the method, what it raised and where in the run; `frames`
    holds the learner's own part of the traceback, as text (it travels from a backtest's
    strategy process), and the exception is chained to the learner's own. Fix the class named:
    ``streamrec.learner.check_learner`` runs it on small batches before a run.
    """

    def __init__(self, message: str, frames: str = "") -> None:
        super().__init__(message, frames)

    def __str__(self) -> str:
        return str(self.args[0])

    @property
    def frames(self) -> str:
        """The traceback from the learner's method down, as Python prints one ("" if none)."""
        return str(self.args[1])


class TrainingDiverged(StreamrecError):
    """Training went non-finite on too many micro-batches in a row.

    Training went non-finite (NaN or infinite loss or gradients) on too many micro-batches
    in a row, or the weights did: nothing was snapshotted from it. Restart from the last
    snapshot, with a lower learning rate if it recurs, and check the samples it stopped on.
    """


class NonFiniteWeights(TrainingDiverged):
    """The model's weights are not all finite, so no snapshot was written (serving keeps the last finite one).

    Restart from the last snapshot, with a lower learning rate.
    """


class FeatureStoreUnavailable(FeatureStoreError):
    """Redis did not answer (down, restarting, failing over).

    The consumers retry until their deadline; bring Redis back.
    """


class FeatureStoreUnreachable(FeatureStoreUnavailable):
    """Redis has not answered at the configured URL since this process started.

    Redis has not answered at the configured URL since this process started (a wrong URL,
    or Redis not started): check STREAMREC_STORE__URL (--redis-url), or start Redis. Waited
    for STREAMREC_STORE__CONNECT_TIMEOUT_S at start, not for the retry deadline.
    """


class Stopped(StreamrecError):
    """A stop signal ended a wait for a service.

    The unfinished batch was not committed and is redone at the next start.
    """


class RankLost(StreamrecError):
    """A learner rank's exchange with the other ranks failed: one stopped, died or was cut off.

    gloo reported the connection closed, or gave up after its own 30 s inside a collective.
    Nothing past the last snapshot was committed: start the group again (with any number of
    ranks); it resumes from there, every sample trained once.
    """


class StrategyProcessLost(StreamrecError):
    """A backtest strategy's process (``--jobs``) ended before its run finished.

    Stopped, killed, or out of memory; nothing was written. Run again, with fewer jobs if memory
    ran out.
    """


class OutageError(StreamrecError):
    """A service stayed failing past the retry deadline (STREAMREC_CONSUMER__RETRY_DEADLINE_S).

    Bring it back and restart; nothing was lost, the unfinished batch is redone.
    """

    @classmethod
    def gave_up(cls, deadline_s: float, reason: object) -> OutageError:
        """The error after ``deadline_s`` of failures, the last for ``reason``, saying what to do."""
        return cls(
            f"gave up after {deadline_s:g} s of failures: {reason}; start the consumers again once "
            "it answers: the unfinished batch is redone (STREAMREC_CONSUMER__RETRY_DEADLINE_S waits longer)"
        )


class FeatureStoreLost(FeatureStoreError):
    """The feature store lost its data (Redis restarted without persistence, or was flushed).

    Or a partition's state while the consumers' group committed an offset on it (Redis replayed
    an AOF without its scripts' writes, keys deleted): the message names each partition.

    Stop the consumers, run `streamrec consumers rebuild`, then start them again. When it was
    rebuilt while they ran, the message says so: then only restart them.
    """


class SamplesExpired(StreamrecError):
    """The newest snapshot resumes at samples the topic no longer holds (retention or a deleted topic).

    Those were never trained. Raise the samples retention, or set
    STREAMREC_LEARNER__ALLOW_SAMPLE_GAPS=true to skip them.
    """


class SamplesTopicRecreated(StreamrecError):
    """The samples topic is not the one the newest snapshot's positions are offsets in.

    It was deleted and created again since the snapshot, or a broker that keeps nothing was
    restarted (its topic id is new), or it is another topic (the setting names another since);
    its offsets start over, so resuming at the snapshot's would
    skip its samples below them without a word. Set STREAMREC_LEARNER__RESUME_ON_NEW_TOPIC=true
    to train the model on from the topic's first sample.
    """


class PartitionFenced(FeatureStoreError):
    """Another consumer claimed a partition this one was still processing.

    Another consumer claimed a partition this one was still processing (this process was
    stalled past its session timeout): it stops without writing to it or committing a batch
    of it; restart it to rejoin.
    """


class PartitionerMismatch(ConfigError):
    """The events' records are where another partitioner puts them: set STREAMREC_KAFKA__PARTITIONER."""
