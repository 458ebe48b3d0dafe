"""Event consumers: window events into Redis sequences and emit point-in-time samples.

`ConsumerRunner` is the consumer process: events in, samples and dead letters out, in
one Kafka transaction per batch. Its logic, free of any client, is `SampleBuilder`
(one batch of events into `BatchResult`); `NoveltyMatchedSampler` draws the
negatives.
"""

from __future__ import annotations

from streamrec.lazy import lazy_exports

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads either)
if TYPE_CHECKING:
    from streamrec.consumers.native_runner import ConsumerRunner, ConsumerStats
    from streamrec.consumers.negatives import NoveltyMatchedSampler
    from streamrec.consumers.processor import BatchResult, SampleBuilder

__all__ = [
    "BatchResult",
    "ConsumerRunner",
    "ConsumerStats",
    "NoveltyMatchedSampler",
    "SampleBuilder",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "streamrec.consumers.negatives": ["NoveltyMatchedSampler"],
        "streamrec.consumers.processor": ["BatchResult", "SampleBuilder"],
        "streamrec.consumers.native_runner": ["ConsumerRunner", "ConsumerStats"],
    },
)

# The top-level ``consumers/`` folder is a link to this package, so from the repository root the
# same files could also import as ``consumers``: two copies of every class. One name only.
if __name__ != "streamrec.consumers":
    raise ImportError(f"import streamrec.consumers, not {__name__}: consumers/ is a link into streamrec/")
