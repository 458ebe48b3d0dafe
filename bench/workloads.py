"""The consumer benchmarks' workloads: the events and the consumer settings they run with."""

from __future__ import annotations

import zlib
from pathlib import Path

import msgspec

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


#: Four declared behaviour features, as a shop's catalogue has them (``--features 4``): a shop
#: id, a brand id, three tag ids and a price.
FOUR_FEATURES: list[dict[str, object]] = [
    {"name": "shop", "kind": "id"},
    {"name": "brand", "kind": "id"},
    {"name": "tags", "kind": "ids", "max_ids": 3},
    {"name": "price", "kind": "number", "transform": "log1p"},
]


def with_features(events: list[Event], count: int) -> tuple[list[Event], list[dict[str, object]]]:
    """The events with ``count`` (0 or 4) declared behaviour features, and their declarations.

    Each item's values follow from its id (a catalogue's): shop ids up to 5,000, brands up to
    800, tags up to 2,000, prices of 0.01 to 999.99 with two decimals.
    """
    if not count:
        return events, []
    if count != len(FOUR_FEATURES):
        raise SystemExit(f"--features takes 0 or {len(FOUR_FEATURES)}")
    out = []
    for event in events:
        h = zlib.crc32(event.item_id.encode())
        features = {
            "shop": str(h % 5_000), "brand": str(h % 800),
            "tags": (str(h % 2_000), str(h // 7 % 2_000), str(h // 49 % 2_000)),
            "price": (h % 99_999 + 1) / 100,
        }
        out.append(msgspec.structs.replace(event, features=features))
    return out, FOUR_FEATURES
