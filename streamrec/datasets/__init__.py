"""Recorded and generated interaction data as contract events, in event-time order.

`read_events` reads the public dataset formats (Taobao UserBehavior, MovieLens, ML-100K,
JSONL); `generate_clicks` generates seeded implicit click streams (a
`ClickStreamSpec`) for tests, demos and benchmarks; `load_events` takes either
(``synthetic[:field=value,...]`` or a path).
"""

from __future__ import annotations

from streamrec.lazy import lazy_exports

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads either)
if TYPE_CHECKING:
    from streamrec.datasets.readers import FORMATS, detect_format, read_events
    from streamrec.datasets.sources import SYNTHETIC, load_events
    from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks

__all__ = [
    "FORMATS",
    "SYNTHETIC",
    "ClickStreamSpec",
    "detect_format",
    "generate_clicks",
    "load_events",
    "read_events",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "streamrec.datasets.readers": ["FORMATS", "detect_format", "read_events"],
        "streamrec.datasets.sources": ["SYNTHETIC", "load_events"],
        "streamrec.datasets.synthetic": ["ClickStreamSpec", "generate_clicks"],
    },
)
