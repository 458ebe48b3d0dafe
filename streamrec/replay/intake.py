"""What the consumers' logic made of a replayed file beside its samples.

The live consumers count their dead letters, duplicates and late events (and log them); a
backtest replaying the same logic reports the same counts, so that nothing it did not score
is dropped without a word: in the report's ``dataset`` section and on the terminal.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from streamrec.config import ConsumerConfig
from streamrec.deadletters import DeadLetter
from streamrec.errors import DatasetError
from streamrec.events import Event
from streamrec.features import FeatureSchema
from streamrec.samples import Sample
from streamrec.wording import plural

#: Dead letters quoted whole in the report, the first ones: enough to find the rest by.
EXAMPLES = 3
# The parts of a reason that name one record (an event id, a time, an offset), left out when
# reasons are counted by kind.
_QUOTED_ID = re.compile(r"(event id )'[^']*'")
_FIRST_AT = re.compile(r" \(first at [^)]*\)")
_NUMBER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Replayed:
    """The samples of a replay and what did not become any.

    ``duplicates``: resent events (the same content again) that yielded nothing; ``late``:
    events behind their partition's watermark (dead-lettered or kept in the sequences without
    samples); ``late_labels``: clicks after their impression's window closed (``join``);
    ``undecided``: impressions whose windows were still open at the end (``join``: no label yet,
    so no sample); ``negatives_short``: negatives the sampler could not draw.
    """

    samples: list[Sample]
    dead: list[DeadLetter] = field(default_factory=list)
    duplicates: int = 0
    late: int = 0
    late_labels: int = 0
    undecided: int = 0
    negatives_short: int = 0

    def section(self) -> dict[str, Any]:
        """The report's counts: ``dead_letters`` (``count``, ``by_reason``, ``examples``) and the rest."""
        return {
            "dead_letters": {
                "count": len(self.dead),
                "by_reason": dict(Counter(reason_kind(d.reason) for d in self.dead).most_common()),
                "examples": [_example(d) for d in self.dead[:EXAMPLES]],
            },
            "duplicates": self.duplicates,
            "late": self.late,
            "late_labels": self.late_labels,
            "undecided": self.undecided,
            "negatives_short": self.negatives_short,
        }


def reason_kind(reason: str) -> str:
    """A dead letter's reason without what names its record: reasons of one kind count together.

    Examples:
        >>> reason_kind("event id 'g0-7' reused with other content (first at 0:7)")
        'event id … reused with other content'
    """
    return _NUMBER.sub("N", _QUOTED_ID.sub(r"\1…", _FIRST_AT.sub("", reason)))


def _example(dead: DeadLetter) -> dict[str, Any]:
    value = None if dead.value is None else dead.value.decode(errors="replace")
    # the offset is the event's place in event-time order: the backtest's records are numbered so
    return {"reason": dead.reason, "event": dead.position.offset, "value": value}


def summary(dataset: dict[str, Any]) -> list[str]:
    """One line per kind of event the backtest made no sample of, from the report's ``dataset``.

    Empty when every event yielded its samples (the negatives the sampler could not draw are
    in the report only: the start of every stream has some).
    """
    lines = []
    dead = dataset.get("dead_letters", {})
    if dead.get("count"):
        kinds = "; ".join(f"{n} × {kind}" for kind, n in dead["by_reason"].items())
        first = dead["examples"][0]["reason"]
        lines.append(f"{dead['count']} dead-lettered, no samples: {kinds} (e.g. {first})")
    said = {
        "duplicates": "resent (duplicates), no samples",
        "late": "late (behind the watermark), no samples",
        "late_labels": "late clicks after their impression's window closed",
        "undecided": "impressions still undecided at the end (window open), no samples",
    }
    lines += [f"{dataset[key]} {text}" for key, text in said.items() if dataset.get(key)]
    lines += [
        f"feature {name!r} (field {seen['field']!r}) is in none of the "
        f"{plural(dataset['events'], 'event')}: it reads its default in every one (check its name or field)"
        for name, seen in dataset.get("features", {}).items() if not seen["events"]
    ]
    return lines


def coverage(events: Sequence[Event], schema: FeatureSchema) -> dict[str, dict[str, Any]]:
    """Per declared feature, the event field it reads and how many of ``events`` carry it.

    A declared name or field no event carries (a typo, or a field the data lacks) reads its
    default everywhere: `summary` says so.
    """
    carried = Counter(name for event in events for name in event.features)
    return {f.name: {"field": f.source, "events": carried[f.name]} for f in schema.extras}


def check_scorable(events: Sequence[Event], replayed: Replayed, cfg: ConsumerConfig) -> None:
    """Refuse a replay no strategy could be scored on: no samples, or every one of one label.

    Raises:
        DatasetError: why, with the setting or the counts to look at.
    """
    samples, n = replayed.samples, len(events)
    if not samples:
        sampled = [e for e in events if e.label is not None or e.action in cfg.positive_actions
                   or (cfg.labels == "join" and e.action == cfg.impression_action)]
        if not sampled:
            actions = ", ".join(cfg.positive_actions)
            raise DatasetError(
                f"no samples: none of the actions of the {plural(n, 'event')} is in "
                "STREAMREC_CONSUMER__POSITIVE_ACTIONS "
                f"({actions}) and none has a label"
            )
        lost = "; ".join(summary(replayed.section())) or "see the consumer settings"
        raise DatasetError(f"no samples from the {plural(n, 'event')}: {lost}")
    labels = {s.label for s in samples}
    if len(labels) == 1:
        which = "positive" if labels == {1} else "negative"
        short = replayed.negatives_short
        why = (
            f"; the sampler could draw none of the {short} negatives asked: it never draws the target or "
            "an item of the user's history, and this stream has too few other items (more users or items, "
            "or labels)"
            if which == "positive" and short else ""
        )
        raise DatasetError(
            f"every one of the {plural(len(samples), 'sample')} is {which}: no ranking can be scored "
            f"(negatives come from STREAMREC_CONSUMER__NEGATIVES, or from events labelled 0){why}"
        )
