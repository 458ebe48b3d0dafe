"""Negative sampling whose novelty matches the positives'.

The trap: on Taobao, 74% of positive targets are items never seen before, while negatives
drawn by recent popularity are almost all known items, so "the item is new" alone separates
them (AUC 0.82) and the metric measures the sampler, not the model. Here every negative has
the novelty of its positive: an item is *new* at time t when it was first seen less than
``novelty_ms`` before t (a learner training every few minutes has not learnt it yet).

- A new positive gets negatives from the items that made their debut in the last
  ``novelty_ms`` of event time.
- A known positive gets negatives from the events of the last ``window_ms``, restricted to
  items that are known at t; weighting by occurrence follows recent popularity, the
  distribution the positive targets themselves come from.
"""

from __future__ import annotations

import types
import zlib
from collections.abc import Collection, Mapping, Sequence

from streamrec.config import ConsumerConfig
from streamrec.features.schema import Value

# Draws per negative before giving up on a pool that is nearly all excluded items.
_MAX_TRIES = 8
_crc32 = zlib.crc32
_DRAWS = [str(j).encode() for j in range(64)]  # draw numbers as the crc reads them

#: An item's declared behaviour features (not outcomes) as one event saw them, by name.
ItemValues = Mapping[str, Value]
#: The values of an event of the default schema: none (shared, read-only).
NO_VALUES: ItemValues = types.MappingProxyType({})
_NO_COLUMNS: Mapping[str, Sequence[Value | None]] = types.MappingProxyType({})
#: One pooled event: (ts, item, category, the item's first-seen time, the item's values).
Entry = tuple[int, str, str, int, ItemValues]
#: A drawn negative: its item, category and values (those of the pooled event it was drawn from).
Pick = tuple[str, str, ItemValues]


class _Pool:
    """The newest ``size`` entries of a time window, oldest first.

    A list and the index of its oldest live entry. A draw indexes it at random (a deque walks to
    the middle: ~0.5 us a draw at 10^5 entries), and a copy is one slice that also drops the
    evicted entries.
    """

    __slots__ = ("entries", "head", "size")

    def __init__(self, size: int, entries: list[Entry] | None = None) -> None:
        self.entries: list[Entry] = entries if entries is not None else []
        self.head = 0
        self.size = size

    def copy(self) -> _Pool:
        return _Pool(self.size, self.entries[self.head :])

    def __len__(self) -> int:
        return len(self.entries) - self.head

    def add(self, entry: Entry, horizon: int) -> None:
        """Append ``entry`` and drop what left the window.

        Append ``entry`` (dropping the oldest beyond ``size``), then drop the entries
        older than ``horizon``, which must not be after the entry's time.
        """
        entries = self.entries
        entries.append(entry)
        head = self.head + (len(entries) - self.head > self.size)
        while entries[head][0] < horizon:  # stops at the entry at the latest
            head += 1
        if head > self.size:
            self._drop(head)
        else:  # the common case without a call: one an event, or two
            self.head = head

    def evict(self, horizon: int) -> None:
        """Drop the oldest entries while they are older than ``horizon``."""
        entries, head, end = self.entries, self.head, len(self.entries)
        while head < end and entries[head][0] < horizon:
            head += 1
        if head > self.size:
            self._drop(head)
        else:
            self.head = head

    def _drop(self, head: int) -> None:
        """As many dropped as may live: free them (amortised O(1))."""
        del self.entries[:head]
        self.head = 0


class NoveltyMatchedSampler:
    """Two event-time pools (recent events, recent debuts) and deterministic per-event draws."""

    def __init__(self, window_ms: int, novelty_ms: int, pool_size: int, seed: int = 0) -> None:
        self.window_ms = window_ms
        self.novelty_ms = novelty_ms
        self._recent = _Pool(pool_size)
        self._debuts = _Pool(pool_size)
        self._seed = seed
        self.short = 0  # negatives that could not be drawn (cold start, tiny pool)
        self.fallback = 0  # negatives meant from the user's own world, drawn globally (`MixedSampler`)

    def copy(self) -> NoveltyMatchedSampler:
        """An independent copy: a batch draws from it and it replaces this one on commit."""
        other = NoveltyMatchedSampler(self.window_ms, self.novelty_ms, self._recent.size, self._seed)
        self._carry(other)
        return other

    def _carry(self, other: NoveltyMatchedSampler) -> None:
        """Give ``other`` (a fresh sampler of the same settings) copies of the pools and the counts."""
        other._recent = self._recent.copy()
        other._debuts = self._debuts.copy()
        other.short = self.short
        other.fallback = self.fallback

    def is_new(self, first_seen: int, ts: int) -> bool:
        """Whether an item first seen at ``first_seen`` counts as new at ``ts``."""
        return first_seen > ts - self.novelty_ms

    def observe(
        self, ts: int, item_id: str, category_id: str, first_seen: int, values: ItemValues = NO_VALUES
    ) -> None:
        """Add one event's item to the pools and drop what fell out of their windows.

        ``values`` are the item's behaviour features as the event has them: a negative drawn
        from this entry carries them (an item's latest values as of the draw, as its category).
        """
        entry = (ts, item_id, category_id, first_seen, values)
        self._recent.add(entry, ts - self.window_ms)
        debuts, horizon = self._debuts, ts - self.novelty_ms
        if ts == first_seen:
            debuts.add(entry, horizon)
        elif debuts.head < len(debuts.entries) and debuts.entries[debuts.head][0] < horizon:
            debuts.evict(horizon)  # most events find nothing to evict: no call then

    def pool_sizes(self) -> tuple[int, int]:
        """(recent events, recent debuts) currently held."""
        return len(self._recent), len(self._debuts)

    def draw(
        self, k: int, *, new: bool, ts: int, exclude: Collection[str], key: str
    ) -> list[Pick]:
        """Up to ``k`` distinct (item, category, values), new or known at ``ts``, not excluded.

        ``key`` (the event id) seeds the draw, so the same pools give the same negatives.
        """
        pool = self._debuts if new else self._recent
        entries, head = pool.entries, pool.head
        size = len(entries) - head
        chosen: list[Pick] = []
        if not (k and size):
            self.short += k
            return chosen
        # Draw j picks index crc32(seed:key:j) mod pool size: deterministic per event and
        # ~20x cheaper than seeding a numpy generator per event (the crc of the prefix is
        # carried into each draw's: the same value, without joining bytes).
        base = _crc32(f"{self._seed}:{key}:".encode())
        taken: list[str] = []  # k is small: a list asks faster than a set is made
        novel_after = ts - self.novelty_ms  # is_new(), inlined
        draw = 0
        for _ in range(k):
            for _ in range(_MAX_TRIES):
                digits = _DRAWS[draw] if draw < len(_DRAWS) else str(draw).encode()
                _, item, category, first_seen, values = entries[head + _crc32(digits, base) % size]
                draw += 1
                if (first_seen > novel_after) == new and item not in exclude and item not in taken:
                    taken.append(item)
                    chosen.append((item, category, values))
                    break
        self.short += k - len(chosen)
        return chosen


class MixedSampler(NoveltyMatchedSampler):
    """The novelty-matched sampler, with shares of negatives from the user's own world.

    A global-only sampler never draws an item of the user's history and seldom one of the
    user's categories, so "the target is in the history" and "the history's share in the
    target's category" separate its labels (the tells, `streamrec.learner.metrics.TELLS`)
    as no impression log of a feed that retrieves by category and re-shows items would. Of
    each event's negatives, a ``history_share`` (in expectation) is an item of the user's
    history as of the event (not the target), a ``category_share`` a recent item of a category
    along that history (picked as often as the history holds it, novelty-matched like the
    global draws, outside the history), and the rest global. A draw that finds nothing fitting
    within a few tries (an empty history, a category with no recent item of the positive's
    novelty) falls back to a global one, so every event still gets its ``k``.

    Same-category draws need pools per category: kept only by this class, so a consumer with
    both shares at 0 (a plain `NoveltyMatchedSampler`) pays nothing for them.
    """

    def __init__(
        self,
        window_ms: int,
        novelty_ms: int,
        pool_size: int,
        seed: int = 0,
        *,
        category_share: float = 0.0,
        history_share: float = 0.0,
    ) -> None:
        super().__init__(window_ms, novelty_ms, pool_size, seed)
        self.category_share = category_share
        self.history_share = history_share
        self._by_category: dict[str, _Pool] = {}
        self._latest = 0  # the newest event time observed

    def copy(self) -> MixedSampler:
        """An independent copy; categories with no event inside the window are dropped."""
        other = MixedSampler(
            self.window_ms, self.novelty_ms, self._recent.size, self._seed,
            category_share=self.category_share, history_share=self.history_share,
        )
        self._carry(other)
        other._latest = self._latest
        horizon = self._latest - self.window_ms
        for category, pool in self._by_category.items():
            if len(pool) and pool.entries[-1][0] >= horizon:  # a draw's eviction may empty one
                other._by_category[category] = pool.copy()
        return other

    def categories(self) -> list[str]:
        """The categories with a pool of recent events."""
        return list(self._by_category)

    def observe(
        self, ts: int, item_id: str, category_id: str, first_seen: int, values: ItemValues = NO_VALUES
    ) -> None:
        """Add one event's item to the pools, its category's among them."""
        super().observe(ts, item_id, category_id, first_seen, values)
        self._latest = max(self._latest, ts)
        if self.category_share:
            pool = self._by_category.get(category_id)
            if pool is None:
                pool = self._by_category[category_id] = _Pool(self._recent.size)
            pool.add((ts, item_id, category_id, first_seen, values), ts - self.window_ms)

    def draw_mixed(
        self,
        k: int,
        *,
        new: bool,
        ts: int,
        target: str,
        items: Sequence[str],
        categories: Sequence[str],
        key: str,
        features: Mapping[str, Sequence[Value | None]] = _NO_COLUMNS,
    ) -> list[Pick]:
        """Up to ``k`` distinct (item, category, values) for a positive on ``target``.

        ``items`` and ``categories`` are the point-in-time history, ``features`` the item
        features along it (a history's item takes its values there); ``key`` seeds the draws.
        """
        base = _crc32(f"{self._seed}:{key}:".encode())
        exclude = (target, *items)
        chosen: list[Pick] = []
        taken: list[str] = []
        history_cut = self.history_share
        category_cut = history_cut + self.category_share
        draw = 0
        for j in range(k):
            kind = _crc32(b"kind%d" % j, base) / 4_294_967_296  # uniform in [0, 1)
            pick: Pick | None = None
            if kind < history_cut and items:
                pick, draw = self._from_history(target, items, categories, features, taken, base, draw)
            elif history_cut <= kind < category_cut and categories:
                pick, draw = self._same_category(new, ts, categories, exclude, taken, base, draw)
            if pick is None:
                if kind < category_cut:  # meant from the user's own world: a fallback
                    self.fallback += 1
                pick, draw = self._global(new, ts, exclude, taken, base, draw)
            if pick is not None:
                taken.append(pick[0])
                chosen.append(pick)
        self.short += k - len(chosen)
        return chosen

    def _from_history(
        self,
        target: str,
        items: Sequence[str],
        categories: Sequence[str],
        features: Mapping[str, Sequence[Value | None]],
        taken: list[str],
        base: int,
        draw: int,
    ) -> tuple[Pick | None, int]:
        """An item of the history (as often as it holds it), not the target nor one taken."""
        for _ in range(_MAX_TRIES):
            index = _crc32(b"h%d" % draw, base) % len(items)
            draw += 1
            item = items[index]
            if item != target and item not in taken:
                values = NO_VALUES
                if features:
                    picked = {n: v[index] for n, v in features.items()}
                    values = {n: v for n, v in picked.items() if v is not None}
                return (item, categories[index], values), draw
        return None, draw

    def _same_category(
        self,
        new: bool,
        ts: int,
        categories: Sequence[str],
        exclude: Collection[str],
        taken: list[str],
        base: int,
        draw: int,
    ) -> tuple[Pick | None, int]:
        """A recent item of a category along the history, of the positive's novelty."""
        horizon, novel_after = ts - self.window_ms, ts - self.novelty_ms
        for _ in range(_MAX_TRIES):
            pool = self._by_category.get(categories[_crc32(b"c%d" % draw, base) % len(categories)])
            draw += 1
            if pool is None:
                continue
            pool.evict(horizon)  # only its own category's events evict it otherwise
            size = len(pool)
            if not size:
                continue
            index = pool.head + _crc32(b"p%d" % draw, base) % size
            _, item, category, first_seen, values = pool.entries[index]
            if (first_seen > novel_after) == new and item not in exclude and item not in taken:
                return (item, category, values), draw
        return None, draw

    def _global(
        self, new: bool, ts: int, exclude: Collection[str], taken: list[str], base: int, draw: int
    ) -> tuple[Pick | None, int]:
        """One draw as `NoveltyMatchedSampler.draw` makes them."""
        pool = self._debuts if new else self._recent
        entries, head = pool.entries, pool.head
        size = len(entries) - head
        novel_after = ts - self.novelty_ms
        for _ in range(_MAX_TRIES if size else 0):
            _, item, category, first_seen, values = entries[head + _crc32(b"g%d" % draw, base) % size]
            draw += 1
            if (first_seen > novel_after) == new and item not in exclude and item not in taken:
                return (item, category, values), draw
        return None, draw


def sampler_for(cfg: ConsumerConfig) -> NoveltyMatchedSampler:
    """The sampler ``cfg`` asks for: the plain one unless a share of mixed negatives is set."""
    if cfg.negative_category_share or cfg.negative_history_share:
        return MixedSampler(
            cfg.negative_window_ms, cfg.novelty_ms, cfg.negative_pool_size, cfg.seed,
            category_share=cfg.negative_category_share, history_share=cfg.negative_history_share,
        )
    return NoveltyMatchedSampler(cfg.negative_window_ms, cfg.novelty_ms, cfg.negative_pool_size, cfg.seed)
