"""The feature stores from a program: wrong items to ``update`` and ``close``, on Redis and in memory.

Found by the Python-API tour, left and mended by the carried-defects tour (tests first).
"""

from __future__ import annotations

import pytest

from streamrec.config import RedisStoreConfig
from streamrec.events import Event
from streamrec.featurestore import Arrival, FeatureStore, MemoryFeatureStore, RedisFeatureStore

T0 = 1_700_000_000_000


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest) -> FeatureStore:
    if request.param == "memory":
        return MemoryFeatureStore(length=3)
    cfg: RedisStoreConfig = request.getfixturevalue("store_config")
    made = RedisFeatureStore(cfg, 3)
    made.attach(can_start_empty=True)
    return made


def click(k: int) -> Event:
    return Event(f"e{k}", "u1", f"i{k}", "c1", "click", T0 + k)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ([click(0)], r"item 0 is an Event .*: wrap each event as Arrival\(event, origin\)"),
        (lambda: [Arrival(click(0), "0:0"), "e1"], r"item 1 is a str 'e1'"),
        (lambda: click(0), r"not a sequence: an Event"),
        (None, r"not a sequence: a NoneType"),
    ],
    ids=["events", "a string among arrivals", "one event", "None"],
)
def test_update_given_no_arrivals_is_a_type_error_naming_what_it_takes(
    store: FeatureStore, given: object, named: str
) -> None:
    """Before: ``AttributeError: 'Event' object has no attribute 'event'`` from inside the store
    (the Redis store's the same), and ``'NoneType' object is not iterable``.
    """
    items = given() if callable(given) else given
    with pytest.raises(TypeError, match=r"update takes a sequence of Arrival, .*" + named):
        store.update(items)  # type: ignore[arg-type]  # the wrong type is the point
    assert store.sequence("u1") == []  # nothing of the batch stored
