"""Recorded and generated interaction data as contract events, in event-time order.

``read_events`` reads the public dataset formats (Taobao UserBehavior, MovieLens, ML-100K,
JSONL); ``synthetic`` generates seeded implicit click streams for tests, demos and benchmarks;
``load_events`` takes either (``synthetic[:field=value,...]`` or a path).
"""

from streamrec.datasets.readers import FORMATS, detect_format, read_events
from streamrec.datasets.sources import SYNTHETIC, load_events

__all__ = ["FORMATS", "SYNTHETIC", "detect_format", "load_events", "read_events"]
