"""A seeded feed log.

What a feed showed (``impression`` events) and what was clicked, in the order an application
publishes it; for the consumers' ``join`` labelling mode.

Built on `generate_clicks`: each ``pv`` of the click
stream becomes a ``click`` on one item of a page of ``page_size`` impressions shown
``click_delay_ms`` earlier (the clicked item and others: uniform over the catalogue, or by
``same_category_share`` and ``history_share`` from the categories and items of the user's own
earlier events, as a feed that retrieves by category and re-shows items would);
``unclicked_pages`` more pages per click are shown with no click. The other actions (cart,
fav, buy) stay as they are. A share of the clicks (``late_share``, none in the stream's last
``2 * late_by_ms``) is published ``late_by_ms`` after its event time, as from a device that
was offline: such a click arrives after its impression's window has closed.

With ``clicks.device_effect`` above 0 (`streamrec.datasets.synthetic`), a visit's pages are
shown on its click's device: each impression has the click's ``device`` field (`Feed.fields`),
so a context feature ``device`` tells which categories are clicked on which device.

The truth a test checks against is `expected_labels`: an impression is positive when
a click published on time falls in its window (the latest impression before the click takes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from streamrec.datasets.synthetic import ClickStreamSpec, generate_rows
from streamrec.events import Event

IMPRESSION = "impression"
# Draws from the user's own items and categories before a page slot is filled from anywhere:
# a user with one item in a one-item category would otherwise draw it for ever.
_MAX_TRIES = 20
CLICK = "click"


@dataclass(frozen=True)
class FeedSpec:
    """Shape of a generated feed log (see the module docstring).

    The defaults suit a 10-minute label window and 5 minutes of allowed lateness: 2,000
    behaviours of 100 users in 4 hours keep each partition's watermark within a minute or so
    of the stream, and a click published 20 minutes late arrives when its impression's window
    has just closed (and is counted as a late label).
    """

    clicks: ClickStreamSpec = field(
        default_factory=lambda: ClickStreamSpec(users=100, events=2_000, duration_ms=4 * 3_600_000)
    )
    page_size: int = 4
    unclicked_pages: int = 1
    click_delay_ms: tuple[int, int] = (1_000, 120_000)
    late_share: float = 0.05
    late_by_ms: int = 20 * 60_000
    seed: int = 0
    # Of a page's other items: the share from a category of the user's earlier events (as a
    # feed that retrieves by category shows), and the share re-shown from the user's earlier
    # items; the rest uniform over the catalogue. 0 and 0: every other item uniform.
    same_category_share: float = 0.0
    history_share: float = 0.0


@dataclass(frozen=True)
class Feed:
    """The log in publish order, which clicks were published late (their ids), and fields.

    ``fields``: by event id, an event's other top-level fields (``device``); absent: none.
    """

    events: list[Event]
    late_clicks: frozenset[str]
    fields: Mapping[str, dict[str, object]] = field(default_factory=dict)


def generate_feed(spec: FeedSpec = FeedSpec()) -> Feed:
    """Generate the feed log ``spec`` describes; the same spec gives the same log."""
    rng = np.random.default_rng(spec.seed)
    rows = generate_rows(spec.clicks)
    clicks = [event for event, _ in rows]
    extra = {event.event_id: fields for event, fields in rows if fields}
    items = sorted({(e.item_id, e.category_id) for e in clicks})
    published: list[tuple[int, int, Event]] = []  # publish time, order, event
    late: set[str] = set()
    end = clicks[-1].ts if clicks else 0  # late clicks only where the stream goes on behind them

    def publish(at: int, event: Event) -> None:
        published.append((at, len(published), event))

    shown = _Shown(spec, items, rng)
    for event in clicks:
        if event.action != "pv":
            publish(event.ts, event)
            shown.saw(event)
            continue
        low, high = spec.click_delay_ms
        shown_at = event.ts - int(rng.integers(low, high + 1))
        for page in range(1 + spec.unclicked_pages):
            at = shown_at - page * high  # earlier pages of the same visit
            page_items = shown.others(event, at, spec.page_size - (page == 0))
            if page == 0:
                page_items.insert(int(rng.integers(0, spec.page_size)), (event.item_id, event.category_id))
            for slot, (item, category) in enumerate(page_items):
                shown_id = f"{event.event_id}-p{page}s{slot}"
                publish(at, Event(shown_id, event.user_id, item, category, IMPRESSION, at))
                if event.event_id in extra:  # shown on the click's device
                    extra[shown_id] = extra[event.event_id]
        shown.saw(event)
        click = Event(event.event_id, event.user_id, event.item_id, event.category_id, CLICK, event.ts)
        if rng.random() < spec.late_share and click.ts < end - 2 * spec.late_by_ms:
            late.add(click.event_id)
            publish(click.ts + spec.late_by_ms, click)
        else:
            publish(click.ts, click)
    published.sort(key=lambda row: (row[0], row[1]))
    return Feed([event for _, _, event in published], frozenset(late), extra)


class _Shown:
    """Which other items a page shows.

    Uniform over the catalogue, or (by the spec's shares) from the user's own earlier events
    and their categories, as of the page's time.
    """

    def __init__(self, spec: FeedSpec, items: list[tuple[str, str]], rng: np.random.Generator) -> None:
        self.spec, self.items, self.rng = spec, items, rng
        self.earlier: dict[str, list[Event]] = {}  # per user, in event-time order
        self.by_category: dict[str, list[tuple[str, str]]] = {}
        for item in items:
            self.by_category.setdefault(item[1], []).append(item)

    def saw(self, event: Event) -> None:
        """Remember an event of the user's."""
        self.earlier.setdefault(event.user_id, []).append(event)

    def others(self, event: Event, at: int, n: int) -> list[tuple[str, str]]:
        """``n`` distinct items other than the clicked one, shown to its user at ``at``."""
        spec, rng = self.spec, self.rng
        if not (spec.same_category_share or spec.history_share):  # the generator's old draws, exactly
            return [self.items[k] for k in rng.choice(len(self.items), n, replace=False).tolist()]
        before = [e for e in self.earlier.get(event.user_id, ()) if e.ts < at]
        out: list[tuple[str, str]] = []
        clicked = (event.item_id, event.category_id)
        tries = 0
        while len(out) < n:
            u = rng.random() if tries < _MAX_TRIES else 1.0  # a user whose world is this page: anywhere
            tries += 1
            if before and u < spec.history_share:
                e = before[int(rng.integers(len(before)))]
                item = (e.item_id, e.category_id)
            elif before and u < spec.history_share + spec.same_category_share:
                pool = self.by_category[before[int(rng.integers(len(before)))].category_id]
                item = pool[int(rng.integers(len(pool)))]
            else:
                item = self.items[int(rng.integers(len(self.items)))]
            if item != clicked and item not in out:
                out.append(item)
                tries = 0
        return out


def expected_labels(feed: Feed, window_ms: int) -> dict[str, int]:
    """Each impression's label, by the join's rule.

    Each impression's label, by the join's rule, for a log published in event-time order
    but for the late clicks (which label nothing).
    """
    by_pair: dict[tuple[str, str], list[Event]] = {}
    labels: dict[str, int] = {}
    for event in feed.events:
        pair = (event.user_id, event.item_id)
        if event.action == IMPRESSION:
            by_pair.setdefault(pair, []).append(event)
            labels[event.event_id] = 0
        elif event.action == CLICK and event.event_id not in feed.late_clicks:
            inside = [s for s in by_pair.get(pair, ()) if s.ts <= event.ts <= s.ts + window_ms]
            if inside:
                labels[max(inside, key=lambda s: (s.ts, s.event_id)).event_id] = 1
    return labels
