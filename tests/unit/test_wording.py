"""``plural``: a count and its noun, as every count of events, samples and letters is said.

Found by the Python-API tour, left: ``streamrec produce`` of a one-event file said ``published 1
events``, and each command's count of events, samples or dead letters likewise; mended by the
carried-defects tour.
"""

from __future__ import annotations

import pytest

from streamrec.wording import plural


@pytest.mark.parametrize(
    ("count", "noun", "said"),
    [
        (0, "event", "0 events"),
        (1, "event", "1 event"),
        (2, "dead letter", "2 dead letters"),
        (-1, "sample", "-1 samples"),
    ],
)
def test_a_count_takes_its_nouns_number(count: int, noun: str, said: str) -> None:
    assert plural(count, noun) == said


def test_an_irregular_plural_and_a_grouped_count() -> None:
    assert plural(1, "micro-batch", "micro-batches") == "1 micro-batch"
    assert plural(3, "micro-batch", "micro-batches") == "3 micro-batches"
    assert plural(12_345, "value", grouped=True) == "12,345 values"
    assert plural(2000, "event") == "2000 events"  # the commands' lines, as tests match them
