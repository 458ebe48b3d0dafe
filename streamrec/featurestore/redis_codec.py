r"""How the Redis store's sequence script is spoken to: events packed in, answers parsed out.

See ``redis_scripts.SEQUENCE_LUA`` for the format on either side.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from streamrec.features.schema import FeatureSpec
from streamrec.featurestore import values
from streamrec.featurestore.base import (
    ACCEPTED,
    CONFLICT,
    DUPLICATE,
    Answer,
    Arrival,
    Behaviour,
    FeaturedHistory,
    History,
)


def parse_call(
    reply: Iterator[str],
    users: list[str],
    by_user: dict[str, list[int]],
    arrivals: Sequence[Arrival],
    answers: list[Answer],
    specs: Sequence[FeatureSpec] = (),
) -> None:
    """Fill ``answers`` from one user call's reply (see ``redis_scripts.SEQUENCE_LUA``).

    Histories carry their values of ``specs``, the store's behaviour features.
    """
    for user in users:
        last = EMPTY  # the user's history read before, which ``3`` repeats
        for index in by_user[user]:
            answer = next(reply)
            code = answer[0]
            if code == "0":
                if arrivals[index].wants_history:
                    last = history(answer, specs)
                    answers[index] = (ACCEPTED, last, "")
            elif code == "3":
                answers[index] = (ACCEPTED, last, "")
            else:  # what the id holds: fingerprint, origin, time
                answers[index] = (_VERDICTS[code], None, answer.split("\t", 2)[1])


_VERDICTS = {"0": ACCEPTED, "1": DUPLICATE, "2": CONFLICT}


_WANT = {(True, False): "0", (True, True): "1", (False, False): "2", (False, True): "3"}


def event_line(arrival: Arrival) -> str:
    r"""One event as the sequence script reads it: ``ts \x1f want \x1f member \x1f mark \n``.

    Ids are printable (the event contract), so neither the unit separator nor a newline can
    occur inside one.
    """
    e = arrival.event
    want = _WANT[arrival.stored, arrival.wants_history]
    return (
        f"{e.ts}\x1f{want}\x1f{e.event_id}\t{e.item_id}\t{e.category_id}\t{e.action}"
        f"\x1f{e.fingerprint()}\t{arrival.origin}\n"
    )


def event_line_with(arrival: Arrival, specs: Sequence[FeatureSpec]) -> str:
    """`event_line` with the event's values of ``specs`` after its action (`values.encode`)."""
    e = arrival.event
    want = _WANT[arrival.stored, arrival.wants_history]
    extras = values.encode(e.features, specs)
    return (
        f"{e.ts}\x1f{want}\x1f{e.event_id}\t{e.item_id}\t{e.category_id}\t{e.action}{extras}"
        f"\x1f{e.fingerprint()}\t{arrival.origin}\n"
    )


def history(answer: str, specs: Sequence[FeatureSpec] = ()) -> History:
    r"""The history in an accepted event's answer.

    ``0``, then ``member \t score`` newest first, all joined by tabs: each entry reads ``id item
    category action score``, the first id after the ``0``.

    The split makes a string of every field: a few microseconds for a full history, a quarter
    of the consumer's time on the 814-user Taobao file (histories ~32 long). So the answer is
    not copied first, nor every field reversed: only the items and categories a sample carries,
    and, when the store keeps behaviour features (``specs``), each one's values along it.
    """
    if len(answer) == 1:
        return EMPTY
    fields = answer.split("\t")
    items, categories = fields[1::5], fields[2::5]
    items.reverse()
    categories.reverse()

    def make() -> list[Behaviour]:
        ids = fields[0::5]
        ids[0] = ids[0][1:]  # the answer's code before the first id
        return [
            Behaviour(
                int(fields[k + 4]), ids[k // 5], fields[k + 1], fields[k + 2], *values.split(fields[k + 3])
            )
            for k in range(len(fields) - 5, -1, -5)
        ]

    if not specs:
        return History(tuple(items), tuple(categories), make)
    actions = fields[3::5]
    actions.reverse()
    return FeaturedHistory(tuple(items), tuple(categories), make, values.columns(actions, specs))


EMPTY = History((), (), list)
FRESH: Answer = (ACCEPTED, None, "")  # accepted, no history asked for
