"""One accepted event's samples: its own, its sampled negatives, and their declared features.

The sample builder (`streamrec.consumers.processor.SampleBuilder`) hands each accepted event,
with its history, to `SampleMaker.samples`. Whether the schema declares features beyond item
and category is chosen once per builder: without them (the default schema) a sample carries
none, costs no dict, and its wire form is what it always was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from streamrec.consumers.negatives import ItemValues, MixedSampler, NoveltyMatchedSampler
from streamrec.consumers.user_features import UserFeatures
from streamrec.events import Event
from streamrec.features.schema import Value
from streamrec.featurestore.base import History
from streamrec.featurestore.profiles import Profile
from streamrec.samples import Sample, encode_sample

SeqValues = dict[str, tuple[Value | None, ...]]


class SampleMaker:
    """Makes an event's samples, with the declared features when the schema has any.

    ``item_features`` are the target's own behaviour features (outcomes aside),
    ``context_features`` the event's context ones; ``profiles`` the user features, read as of
    each sample's time from `as_of` (the batch's users' profiles, set before its samples).
    """

    def __init__(
        self,
        negatives: int,
        profiles: UserFeatures,
        item_features: tuple[str, ...],
        context_features: tuple[str, ...],
        *,
        featured: bool,
        mixed: bool,
    ) -> None:
        """Draw ``negatives`` a positive; ``mixed``: from a `MixedSampler`'s own draws."""
        self._negatives = negatives  # read for every click: a pydantic field costs ~8 plain reads
        self._profiles = profiles
        self._item_features = item_features
        self._context_features = context_features
        self._featured = featured
        self._mixed = mixed
        self.as_of: Mapping[str, Profile] = {}

    def samples(
        self,
        out: list[Sample],
        values: list[bytes],
        sampler: NoveltyMatchedSampler,
        event: Event,
        history: History,
        first_seen: int,
    ) -> None:
        """Add an event's samples to ``out`` and their wire forms to ``values``.

        Its own (its label, or a positive), and for an implicit positive the sampled
        negatives, all with the same history; with a `MixedSampler` the negatives come from
        the user's history and categories too, by the sampler's shares. With declared
        features the target's behaviour values (outcomes aside), the user's and the event's
        context are in `Sample.features`, the history's behaviour values, outcomes included,
        in `Sample.seq_features`; a negative carries its item's values
        (`NoveltyMatchedSampler.observe`) and the event's context.
        """
        items, categories = history.items, history.categories
        event_id, user_id, ts, label = event.event_id, event.user_id, event.ts, event.label
        item_id, own = event.item_id, 1 if label is None else label
        featured = self._featured
        if featured:
            target, seq, context = self.values(event, history)
            made = [
                Sample(event_id, user_id, ts, item_id, event.category_id, own, items, categories, target, seq)
            ]
        else:  # the default schema: no feature, no dict, the wire form as it always was
            made = [Sample(event_id, user_id, ts, item_id, event.category_id, own, items, categories)]
        if label is None:
            new = sampler.is_new(first_seen, ts)
            if self._mixed:
                along = {n: seq[n] for n in self._item_features if n in seq} if featured else {}
                negatives = cast(MixedSampler, sampler).draw_mixed(
                    self._negatives,
                    new=new,
                    ts=ts,
                    target=item_id,
                    items=items,
                    categories=categories,
                    key=event_id,
                    features=along,
                )
            else:
                negatives = sampler.draw(
                    self._negatives,
                    new=new,
                    ts=ts,
                    exclude=(item_id, *items),  # a pick is checked against it once or twice
                    key=event_id,
                )
            # loops, not comprehensions: on Python 3.11 each comprehension is a function call
            if not featured:
                for k, (item, category, _) in enumerate(negatives):
                    made.append(Sample(f"{event_id}~n{k}", user_id, ts, item, category, 0, items, categories))
            else:
                for k, (item, category, item_values) in enumerate(negatives):
                    made.append(
                        Sample(
                            f"{event_id}~n{k}",
                            user_id,
                            ts,
                            item,
                            category,
                            0,
                            items,
                            categories,
                            {**item_values, **context},
                            seq,
                        )
                    )
        out += made
        values += map(encode_sample, made)

    def values(self, event: Event, history: History) -> tuple[dict[str, Value], SeqValues, dict[str, Value]]:
        """An event's sample features, its history's, and the part its negatives share.

        The target's behaviour values (outcomes aside), the user's as of the event's time and
        the event's context; the history's behaviour values; and those two last alone.
        """
        context = self._profiles.as_of(self.as_of, event)
        context.update(picked(event.features, self._context_features))
        target = {**picked(event.features, self._item_features), **context}
        return target, dict(history.features), context

    def described(self, event: Event, history: History) -> tuple[dict[str, Value], SeqValues]:
        """What a join window keeps of its impression: `values` as of its time (`JoinRule`)."""
        target, seq, _ = self.values(event, history)
        return target, seq


def picked(features: ItemValues, names: tuple[str, ...]) -> dict[str, Value]:
    """The values of ``names`` among an event's ``features`` (the missing ones left out)."""
    return {name: features[name] for name in names if name in features} if features else {}
