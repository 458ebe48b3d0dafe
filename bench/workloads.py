"""The consumer benchmarks' workloads: the events and the consumer settings they run with."""

from __future__ import annotations

from pathlib import Path

from streamrec.datasets import read_events
from streamrec.datasets.feed import FeedSpec, generate_feed
from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks
from streamrec.events import Event

TAOBAO = Path(__file__).resolve().parents[2] / "shared/data/taobao-userbehavior-2h/UserBehavior.csv"
DEFAULT = str(TAOBAO) if TAOBAO.exists() else "synthetic"


def workload(data: str, events: int | None) -> tuple[list[Event], dict[str, object]]:
    """The events of a workload and the consumer settings they need.

    The events of ``data`` (a file of Taobao UserBehavior, ``synthetic`` or ``feed``; the
    first ``events``, or 110,300 generated) and the consumer settings they need.

    ``feed``: a generated feed log (pages of impressions, clicks on shown items, about 8
    events a behaviour, 4 hours of it over 14k users) through the ``join`` labelling mode.
    ``synthetic``: generated clicks shaped like the Taobao slice (many users, few events each).
    """
    count = events or 110_300
    if data == "feed":
        spec = ClickStreamSpec(users=14_000, items=85_000, events=count // 8,
                               duration_ms=4 * 3_600_000, seed=1)
        feed = generate_feed(FeedSpec(clicks=spec, seed=1)).events[:count]
        return feed, {"labels": "join", "label_window_ms": 600_000, "allowed_lateness_ms": 300_000}
    if data == "synthetic":
        return generate_clicks(ClickStreamSpec(users=66_000, items=85_000, events=count, seed=1)), {}
    return read_events(Path(data), limit=events), {}


def label(data: str) -> str:
    """The data's name in a benchmark's JSON."""
    return data if data in ("synthetic", "feed") else Path(data).name
