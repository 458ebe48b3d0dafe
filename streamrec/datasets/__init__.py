"""Recorded and generated interaction data as contract events, in event-time order.

``read_events`` reads the public dataset formats (Taobao UserBehavior, MovieLens, ML-100K,
JSONL); ``synthetic`` generates seeded implicit click streams for tests, demos and benchmarks.
"""

from streamrec.datasets.readers import FORMATS, detect_format, read_events

__all__ = ["FORMATS", "detect_format", "read_events"]
