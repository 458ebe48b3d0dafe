"""Event consumers: window events into Redis sequences and emit point-in-time samples."""

from streamrec.consumers.negatives import NoveltyMatchedSampler
from streamrec.consumers.processor import BatchResult, SampleBuilder
from streamrec.consumers.runner import ConsumerRunner, ConsumerStats

__all__ = [
    "BatchResult",
    "ConsumerRunner",
    "ConsumerStats",
    "SampleBuilder",
    "NoveltyMatchedSampler",
]


# The top-level ``consumers/`` folder is a link to this package, so from the repository root the
# same files could also import as ``consumers``: two copies of every class. One name only.
if __name__ != "streamrec.consumers":
    raise ImportError(f"import streamrec.consumers, not {__name__}: consumers/ is a link into streamrec/")
