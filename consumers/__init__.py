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
