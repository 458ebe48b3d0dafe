"""Seeded synthetic implicit-feedback click streams, shaped like Taobao UserBehavior.

What it generates: contract `Event` objects (``label=None``, action
``pv``/``cart``/``fav``/``buy``) sorted by event time, from a `ClickStreamSpec`. The same
spec, seed included, gives exactly the same events in every process.

Why: the real Taobao data may not be redistributed, so it is absent from a fresh clone and
from the package. Guarantee tests, demos, benchmarks and backtests still need a stream with
the properties that matter to the pipeline and to DIN, so this module makes one:

- users with heavy-tailed (log-normal) activity, each with a few preferred categories, acting
  in sessions: a user's events cluster in time and around one category per session, so the
  behaviour sequence predicts the categories of the next clicks (the signal DIN learns);
- items with Zipf-like popularity, each in exactly one category for good;
- new items appearing all along the stream (``new_item_share`` of the catalogue): an item
  debuts with its first event, is never clicked before it, and is hot for a quarter of an
  hour after it, so a large share of events hit items first seen minutes earlier, as on Taobao.

Measured on the default spec (seed 0; the 814-user Taobao sample, measured the same way, in
brackets):

- 20,000 events from 500 users over 48 hours of event time, on 4,071 distinct items of the
  5,000 in the catalogue, in 50 categories; 2,500 items debut during the stream;
- 44.0% of ``pv`` events are on an item whose first event is less than 10 minutes
  (600,000 ms) earlier, that first event included [71%, as most Taobao items are seen once];
  23.7% counting only the later events [6%]; 43.8-45.8% over seeds 0-9;
- the top 1% of items (50) carry 19.5% of events [7%; uniform popularity gives about 1-2%];
- action mix pv 89.9%, cart 5.0%, fav 2.8%, buy 2.2% (the spec asks 89.8/5.3/2.8/2.1);
- events per user: min 4, median 26, max 491 [4, 78, 539]; consecutive events of a user are
  a median 0.9 minutes apart [1.2];
- 84% of a user's events are in their three most-clicked categories [46%, of 2,911] (31%
  with categories shuffled across events); 77% of events are in a category among the user's
  previous five [59%], the signal DIN learns;
- generated in about 0.05 s; 200,000 events (5,000 users, 50,000 items) in about 0.5 s.

A context feature with a known effect, for checking that a model uses a declared feature (and
that the backtest's ablation sees it): with ``device_effect`` above 0 every session runs on a
device, ``ios``, ``android`` or ``web`` (45/35/20%), given as the field ``device`` of its
events, and a ``device_effect`` share of events has its category redrawn, by popularity, from
its device's categories (category ``c<k>`` belongs to device ``k % 3``, `device_of`). With
0.5, about two thirds of a device's events are in its categories against a third without: the
category a user clicks depends on the device. Declare it as a context feature (``{"name":
"device", "role": "context"}``) to have the events carry it (`generate_clicks`'s ``schema``).
Device draws have a generator of their own, so the stream's other draws are those of the same
spec without devices; the default, 0, gives the stream as it always was, with no device.

Usage::

    from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks

    events = generate_clicks()  # the default test-sized stream
    bigger = generate_clicks(ClickStreamSpec(users=5_000, items=50_000, events=200_000, seed=7))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from streamrec.datasets.declared import declare
from streamrec.errors import FieldError
from streamrec.events import MIN_TS_MS, Event
from streamrec.features import FeatureSchema

# Per-user activity is log-normal with this sigma: over 500 users the most active one makes
# about 20x the median's events, a few "whales" and many light users. Taobao's 814-user sample
# has 539/78 = 7x; a slightly heavier tail keeps whales present in small streams too.
_ACTIVITY_SIGMA = 1.0
# Every user gets at least this many events (when events allow): the Taobao sample's minimum,
# and enough for a behaviour sequence to predict something.
_MIN_USER_EVENTS = 4
# Mean events per session; a browsing session on a shop is a handful of page views.
_SESSION_EVENTS = 8
# Mean session length (exponential): a quarter of an hour of browsing.
_SESSION_SPAN_MS = 15 * 60_000
# Preferred categories per user: "a few", enough for variety, few enough to predict.
_PREFERRED_CATEGORIES = 3
# Share of category choices made among the user's preferred categories; the rest explore
# the whole catalogue (by category popularity). A quarter of exploration keeps the profile a
# strong but imperfect signal (on Taobao 59% of clicks are in a category of the last five).
_PREFERENCE_SHARE = 0.75
# Share of a session's events in that session's focus category: sessions are on-topic, which
# makes the recent sequence more predictive than the long-term profile (DIN's premise).
_SESSION_FOCUS = 0.6
# Category popularity is Zipf-like with this exponent: some categories are much larger than
# others, but milder than item popularity (categories aggregate many items).
_CATEGORY_EXPONENT = 0.7
# An item is hot for this long after its debut. Tuned with the hot share below (over windows
# of 10-20 minutes and shares of 0.6-0.8) so that, with the defaults, about 44% of pv events
# hit items first seen < 10 minutes earlier (seeds 0-9): a clear margin over the 30% target.
_HOT_WINDOW_MS = 15 * 60_000
# Chance that a click in a category with hot (just-debuted) items goes to one of them rather
# than to the established catalogue: new listings get a strong, short boost in the feed.
_HOT_SHARE = 0.8
#: The devices of a stream with ``device_effect`` > 0; category ``c<k>`` is device ``k % 3``'s.
DEVICES = ("ios", "android", "web")
# Sessions per device: roughly a mobile-first shop's mix, uneven so a device's share of events
# alone tells something different from its categories' share.
_DEVICE_SHARES = (0.45, 0.35, 0.20)
# The device draws' generator is seeded by (seed, this): its own stream of draws, so turning
# devices on changes only what they change.
_DEVICE_STREAM = 1


# --- validation (above the spec: its default instance is checked at import) ---------------


def _refuse(say: Callable[[Callable[[str], str]], str]) -> FieldError:
    """The error ``say`` words, each field named as its caller knows it (`FieldError.naming`)."""
    return FieldError("ClickStreamSpec", say)


def _out_of_range(field: str, wanted: str, value: object) -> FieldError:
    """``<field> must be <wanted>, got <value>``."""
    return _refuse(lambda n: f"{n(field)} must be {wanted}, got {value!r}")


def _check_counts(spec: ClickStreamSpec) -> None:
    for name in ("users", "items", "categories", "events", "duration_ms"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _out_of_range(name, "a positive integer", value)
    if spec.items < spec.categories:
        raise _refuse(
            lambda n: f"{n('items')} ({spec.items}) must be at least {n('categories')} "
            f"({spec.categories}) so that every category has an item"
        )


def _check_time_and_seed(spec: ClickStreamSpec) -> None:
    if isinstance(spec.seed, bool) or not isinstance(spec.seed, int) or spec.seed < 0:
        raise _out_of_range("seed", "a non-negative integer", spec.seed)
    start = spec.start_ms
    if isinstance(start, bool) or not isinstance(start, int) or start < MIN_TS_MS:
        raise _out_of_range("start_ms", "epoch milliseconds", start)
    # Items are searched by category * (duration_ms + 2) + time, an int64 key.
    if spec.categories * (spec.duration_ms + 2) >= 2**63:
        raise _refuse(lambda n: f"{n('categories')} * {n('duration_ms')} is too large (int64 overflow)")


def _check_shares(spec: ClickStreamSpec) -> None:
    for name in ("new_item_share", "device_effect"):
        share = getattr(spec, name)
        if not isinstance(share, int | float) or not 0.0 <= share <= 1.0:
            raise _out_of_range(name, "in [0, 1]", share)
    exponent = spec.popularity_exponent
    if not isinstance(exponent, int | float) or not (math.isfinite(exponent) and exponent >= 0):
        raise _out_of_range("popularity_exponent", "a finite number >= 0", exponent)


def _check_actions(actions: tuple[tuple[str, float], ...]) -> None:
    if not actions or any(not isinstance(pair, tuple) or len(pair) != 2 for pair in actions):
        raise _out_of_range("actions", "(name, probability) pairs", actions)
    names = [name for name, _ in actions]
    if len(set(names)) != len(names):
        raise _refuse(lambda n: f"{n('actions')} names an action twice: {names}")
    for name, weight in actions:
        if not isinstance(name, str) or not name or not name.isprintable() or name != name.strip():
            raise _bad_action(f"{name!r} is not a printable action name")
        if not isinstance(weight, int | float) or not (math.isfinite(weight) and weight > 0):
            raise _bad_action(f"probability of {name!r} must be > 0, got {weight!r}")


def _bad_action(problem: str) -> FieldError:
    return _refuse(lambda n: f"{n('actions')}: {problem}")


@dataclass(frozen=True)
class ClickStreamSpec:
    """Shape of a generated stream; the defaults are sized for unit tests (well under a second).

    Attributes:
        users: Users in the stream; 500 gives sequences of tens of events per user at the
            default event count, like the 814-user Taobao sample (median 78).
        items: Catalogue size by the end of the stream; 5,000 makes about 4 events per item,
            so item embeddings see repeats while most items stay in the long tail.
        categories: Item categories; 50 leaves each user's 3 preferred categories a clear
            minority of the catalogue, so category concentration is a real signal.
        events: Events to generate; 20,000 is large enough for stable statistics and small
            enough for sub-second generation in tests.
        new_item_share: Share of the catalogue that debuts during the stream (the rest exists
            at the start). 0.5 reproduces Taobao's flood of new items; at least one item always
            exists at the start, and at most one item debuts per event.
        popularity_exponent: Exponent of the Zipf-like item popularity (weight ``1/rank**s``);
            1.0 is the classic Zipf law, 0 makes popularity uniform.
        actions: ``(action, weight)`` pairs; weights are normalised to probabilities. The
            default is roughly Taobao's mix: pv 89.8%, cart 5.3%, fav 2.8%, buy 2.1%.
        start_ms: Event time (epoch ms) of the stream's start; fixed so the stream is
            reproducible (2023-11-14 22:13:20 UTC).
        duration_ms: Event-time span of the stream; two days hold tens of sessions per user and
            a steady arrival of new items, while the default events stay dense enough for new
            items to meet their first clicks. (Sessions start uniformly: no day/night rhythm.)
        seed: Seed of ``numpy.random.default_rng``; non-negative. Also in the event ids.
        device_effect: Share of events whose category is redrawn from their session's
            device's categories (the module docstring); 0, the default: no devices, no
            ``device`` field. In [0, 1].
    """

    users: int = 500
    items: int = 5_000
    categories: int = 50
    events: int = 20_000
    new_item_share: float = 0.5
    popularity_exponent: float = 1.0
    actions: tuple[tuple[str, float], ...] = (
        ("pv", 0.898),
        ("cart", 0.053),
        ("fav", 0.028),
        ("buy", 0.021),
    )
    start_ms: int = 1_700_000_000_000
    duration_ms: int = 2 * 24 * 3_600_000
    seed: int = 0

    device_effect: float = 0.0

    def __post_init__(self) -> None:
        _check_counts(self)
        _check_time_and_seed(self)
        _check_shares(self)
        _check_actions(self.actions)

    @property
    def new_items(self) -> int:
        """Items that debut during the stream.

        ``round(items * new_item_share)``, but at most ``events`` (each item debuts with an
        event) and ``items - 1`` (at least one item exists at the start).
        """
        return max(0, min(round(self.items * self.new_item_share), self.events, self.items - 1))


def generate_clicks(
    spec: ClickStreamSpec = ClickStreamSpec(), schema: FeatureSchema | None = None
) -> list[Event]:
    """Generate the click stream described by ``spec``.

    Args:
        spec: The stream's shape and seed.
        schema: The deployment's features: each event carries the values of the declared
            extras among its fields (``device``); None: none.

    Returns:
        ``spec.events`` implicit events (``label=None``) sorted by ``ts``, ties in a fixed
        order; event ids ``g<seed>-<n>`` are unique and stable for a seed.

    Examples:
        >>> events = generate_clicks(ClickStreamSpec(users=3, items=10, categories=2, events=5, seed=1))
        >>> len(events), events[0].event_id, events[0].action
        (5, 'g1-0', 'pv')
        >>> events == generate_clicks(ClickStreamSpec(users=3, items=10, categories=2, events=5, seed=1))
        True
    """
    specs = () if schema is None else schema.extras
    return [declare(event, fields, specs, "generated stream") for event, fields in generate_rows(spec)]


def generate_rows(spec: ClickStreamSpec = ClickStreamSpec()) -> list[tuple[Event, dict[str, object]]]:
    """`generate_clicks`'s events, each with its other fields (``device``, when there are devices)."""
    stream = _simulate(spec)
    users = [f"u{u}" for u in range(spec.users)]
    categories = [f"c{c}" for c in range(spec.categories)]
    actions = [name for name, _ in spec.actions]
    rows = zip(
        stream.user.tolist(),
        stream.item.tolist(),
        stream.category.tolist(),
        stream.action.tolist(),
        stream.ts.tolist(),
        strict=True,
    )
    events = [
        Event(f"g{spec.seed}-{n}", users[u], stream.item_names[i], categories[c], actions[a], t)
        for n, (u, i, c, a, t) in enumerate(rows)
    ]
    if stream.device is None:
        return [(event, {}) for event in events]
    return [(event, {"device": DEVICES[d]}) for event, d in zip(events, stream.device.tolist(), strict=True)]


def device_of(category: str) -> str:
    """The device whose sessions favour ``category`` (``c<k>``: ``DEVICES[k % 3]``).

    Examples:
        >>> device_of("c0"), device_of("c4"), device_of("c5")
        ('ios', 'android', 'web')
    """
    return DEVICES[int(category[1:]) % len(DEVICES)]


def item_debuts(spec: ClickStreamSpec = ClickStreamSpec()) -> dict[str, int]:
    """The items of `generate_clicks` that debut during the stream, with debut times.

    An item's debut is its first event; the other items exist from ``spec.start_ms``. For
    backtests that score cold-start items separately. Costs a generation without the events.
    """
    stream = _simulate(spec)
    new = np.arange(spec.items - spec.new_items, spec.items)
    return dict(zip([stream.item_names[i] for i in new], stream.debut_ms[new].tolist(), strict=True))


# --- simulation ---------------------------------------------------------------------------


class _Stream(NamedTuple):
    """The generated stream as index arrays, already in event-time order."""

    user: np.ndarray
    item: np.ndarray
    category: np.ndarray
    action: np.ndarray
    ts: np.ndarray
    item_names: list[str]
    debut_ms: np.ndarray  # per item index; old items: start_ms - 1
    device: np.ndarray | None = None  # per event, an index into DEVICES; None: no devices


class _Catalogue(NamedTuple):
    """Items by index: old ones ``0..n_old-1``, then new ones in anchor order."""

    category: np.ndarray
    popularity: np.ndarray
    debut_rel: np.ndarray  # ms after start_ms, plus one; 0 for items there from the start


def _simulate(spec: ClickStreamSpec) -> _Stream:
    """Draw the whole stream: who acts when, in which category, on which item, doing what."""
    rng = np.random.default_rng(spec.seed)
    cat_weights = _zipf(spec.categories, _CATEGORY_EXPONENT)
    sessions = _sessions(spec, rng)
    user, ts = sessions.user, sessions.ts
    category = _categories(spec, sessions, cat_weights, rng)
    device = _devices(spec, sessions, category, cat_weights) if spec.device_effect > 0 else None
    anchors = rng.choice(len(ts), size=spec.new_items, replace=False)
    catalogue = _catalogue(spec, category[anchors], ts[anchors], cat_weights, rng)
    item = _pick_items(spec, catalogue, category, ts, rng)
    item[anchors] = np.arange(spec.items - spec.new_items, spec.items)
    action = rng.choice(len(spec.actions), size=len(ts), p=_normalised([w for _, w in spec.actions]))
    names = [f"i{k}" for k in rng.permutation(spec.items).tolist()]
    order = np.argsort(ts, kind="stable")
    return _Stream(
        user[order], item[order], catalogue.category[item][order], action[order], ts[order],
        names, spec.start_ms - 1 + catalogue.debut_rel, None if device is None else device[order],
    )


def _devices(
    spec: ClickStreamSpec, sessions: _Sessions, category: np.ndarray, cat_weights: np.ndarray
) -> np.ndarray:
    """Each event's device (its session's); moves a ``device_effect`` share of ``category`` to it."""
    rng = np.random.default_rng([spec.seed, _DEVICE_STREAM])
    device = rng.choice(len(DEVICES), size=len(sessions.session_user), p=_DEVICE_SHARES)[sessions.session]
    moved = rng.random(len(category)) < spec.device_effect
    owner = np.arange(spec.categories) % len(DEVICES)
    for d in range(len(DEVICES)):
        pool = np.flatnonzero(owner == d)
        chosen = moved & (device == d)
        if len(pool):  # a stream of fewer categories than devices leaves the others as they are
            category[chosen] = rng.choice(pool, size=int(chosen.sum()), p=_normalised(cat_weights[pool]))
    return device


def _zipf(n: int, exponent: float) -> np.ndarray:
    """Probabilities ``1/rank**exponent`` for ranks ``1..n``, normalised."""
    return _normalised((np.arange(1, n + 1, dtype=np.float64)) ** -exponent)


def _normalised(weights: np.ndarray | list[float]) -> np.ndarray:
    """``weights`` as float64 probabilities summing to one."""
    array = np.asarray(weights, dtype=np.float64)
    return array / array.sum()


def _user_counts(spec: ClickStreamSpec, rng: np.random.Generator) -> np.ndarray:
    """Events per user: a floor for everyone, the rest by heavy-tailed activity."""
    activity = _normalised(rng.lognormal(0.0, _ACTIVITY_SIGMA, spec.users))
    floor = min(_MIN_USER_EVENTS, spec.events // spec.users)
    return floor + rng.multinomial(spec.events - floor * spec.users, activity)


class _Sessions(NamedTuple):
    """Per event: its user, session and time; per session: its user."""

    user: np.ndarray
    session: np.ndarray
    ts: np.ndarray
    session_user: np.ndarray


def _sessions(spec: ClickStreamSpec, rng: np.random.Generator) -> _Sessions:
    """Each event's user and time: users act in sessions that start anywhere in the span."""
    counts = _user_counts(spec, rng)
    per_user = np.where(counts > 0, 1 + rng.binomial(np.maximum(counts - 1, 0), 1 / _SESSION_EVENTS), 0)
    first = np.cumsum(per_user) - per_user
    user = np.repeat(np.arange(spec.users), counts)
    session = first[user] + (rng.random(len(user)) * per_user[user]).astype(np.int64)
    span = np.minimum(rng.exponential(_SESSION_SPAN_MS, int(per_user.sum())), spec.duration_ms)
    begin = spec.start_ms + rng.random(len(span)) * (spec.duration_ms - span)
    ts = np.floor(begin[session] + rng.random(len(user)) * span[session]).astype(np.int64)
    return _Sessions(user, session, ts, np.repeat(np.arange(spec.users), per_user))


def _categories(
    spec: ClickStreamSpec, sessions: _Sessions, cat_weights: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Each event's category: mostly its session's focus, else the user's usual mix."""
    preferred = rng.choice(spec.categories, size=(spec.users, _PREFERRED_CATEGORIES), p=cat_weights)
    taste = np.cumsum(rng.dirichlet(np.ones(_PREFERRED_CATEGORIES), size=spec.users), axis=1)
    focus = _taste_draw(sessions.session_user, preferred, taste, cat_weights, rng)
    usual = _taste_draw(sessions.user, preferred, taste, cat_weights, rng)
    on_topic = rng.random(len(sessions.user)) < _SESSION_FOCUS
    return np.where(on_topic, focus[sessions.session], usual)


def _taste_draw(
    user: np.ndarray, preferred: np.ndarray, taste: np.ndarray, cat_weights: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """One category per entry of ``user``: a preferred one by taste, or an exploring one."""
    rank = (rng.random(len(user))[:, None] > taste[user]).sum(axis=1)
    liked = preferred[user, np.minimum(rank, _PREFERRED_CATEGORIES - 1)]
    explored = rng.choice(len(cat_weights), size=len(user), p=cat_weights)
    return np.where(rng.random(len(user)) < _PREFERENCE_SHARE, liked, explored)


def _catalogue(
    spec: ClickStreamSpec, anchor_category: np.ndarray, anchor_ts: np.ndarray,
    cat_weights: np.ndarray, rng: np.random.Generator,
) -> _Catalogue:
    """Old items spread over the categories; each new item takes its debut event's category."""
    n_old = spec.items - spec.new_items
    spread = np.arange(min(n_old, spec.categories))  # every category gets an item if it can
    drawn = rng.choice(spec.categories, size=n_old - len(spread), p=cat_weights)
    category = np.concatenate([spread, drawn, anchor_category]).astype(np.int64)
    popularity = (rng.permutation(spec.items) + 1.0) ** -spec.popularity_exponent
    debut_rel = np.concatenate([np.zeros(n_old, np.int64), anchor_ts - spec.start_ms + 1])
    return _Catalogue(category, popularity, debut_rel)


def _pick_items(
    spec: ClickStreamSpec, catalogue: _Catalogue, category: np.ndarray, ts: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Each event's item: a hot new item of its category, else one by popularity.

    Only items that debuted strictly before the event are eligible, so no item is clicked
    before (or at the same millisecond as) its debut event.
    """
    span = spec.duration_ms + 2  # relative times lie in 0..duration_ms+1
    key = catalogue.category * span + catalogue.debut_rel
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    now_rel = ts - spec.start_ms + 1
    lo = np.searchsorted(sorted_key, category * span, side="left")
    hi = np.searchsorted(sorted_key, category * span + now_rel, side="left")
    hot_since = np.maximum(now_rel - _HOT_WINDOW_MS, 1)  # 1: new items only, never old ones
    hot_lo = np.searchsorted(sorted_key, category * span + hot_since, side="left")
    picked = _weighted_in_range(catalogue.popularity[order], lo, hi, rng)
    hot = (hi > hot_lo) & (rng.random(len(ts)) < _HOT_SHARE)
    fresh = hot_lo + (rng.random(len(ts)) * (hi - hot_lo)).astype(np.int64)
    picked = np.where(hot, fresh, picked)
    item = order[np.clip(picked, 0, len(order) - 1)]
    empty = hi == lo
    item[empty] = _any_category(catalogue, now_rel[empty], rng)
    return item


def _weighted_in_range(
    weights: np.ndarray, lo: np.ndarray, hi: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """For each ``[lo, hi)`` range of ``weights``, one index drawn by weight (lo if empty)."""
    cum = np.concatenate([[0.0], np.cumsum(weights)])
    target = cum[lo] + rng.random(len(lo)) * (cum[hi] - cum[lo])
    return np.clip(np.searchsorted(cum, target, side="right") - 1, lo, np.maximum(hi - 1, lo))


def _any_category(catalogue: _Catalogue, now_rel: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Fallback for a category with no item yet: any item already there, by popularity."""
    order = np.argsort(catalogue.debut_rel, kind="stable")
    hi = np.searchsorted(catalogue.debut_rel[order], now_rel, side="left")
    picked = _weighted_in_range(catalogue.popularity[order], np.zeros_like(hi), hi, rng)
    return order[picked]
