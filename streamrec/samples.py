"""The training-sample contract on topic ``streamrec.samples`` (key = ``user_id``).

A sample pairs a target item with the user's behaviour sequence *as it was before* the event
(only behaviours with an earlier event time), so training never sees the future.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson


@dataclass(frozen=True, slots=True)
class Sample:
    """One labelled (user, target item) pair with the point-in-time behaviour sequence.

    ``seq_items``/``seq_categories`` are oldest first, all strictly earlier than ``ts``.
    ``sample_id`` is the event id for a positive or explicit sample and ``<event_id>~n<k>``
    for the k-th sampled negative, so a redelivered event yields the same ids.
    """

    sample_id: str
    user_id: str
    ts: int
    item_id: str
    category_id: str
    label: int
    seq_items: tuple[str, ...]
    seq_categories: tuple[str, ...]

    def to_json(self) -> bytes:
        """Encode in the wire form."""
        return orjson.dumps(
            {
                "sample_id": self.sample_id,
                "user_id": self.user_id,
                "ts": self.ts,
                "item_id": self.item_id,
                "category_id": self.category_id,
                "label": self.label,
                "seq_items": self.seq_items,
                "seq_categories": self.seq_categories,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> Sample:
        """Decode the wire form (samples are produced by streamrec, so trusted)."""
        doc = orjson.loads(raw)
        return cls(
            sample_id=doc["sample_id"],
            user_id=doc["user_id"],
            ts=doc["ts"],
            item_id=doc["item_id"],
            category_id=doc["category_id"],
            label=doc["label"],
            seq_items=tuple(doc["seq_items"]),
            seq_categories=tuple(doc["seq_categories"]),
        )
