"""A feature store made in code refuses a sequence length or dedup horizon no settings allow.

Found by the Python-API tour (test first): ``MemoryFeatureStore(length=0)`` kept every behaviour and
gave every click an empty history, ``length=-1`` kept two, a NaN horizon was taken; the settings
(``model.sequence_length`` >= 1, ``consumer.dedup_horizon_ms`` >= 0) refuse them, the constructor did not.
"""

from __future__ import annotations

import re

import pytest

from streamrec.errors import ConfigError
from streamrec.featurestore import MemoryFeatureStore


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((0,), "length must be an int of at least 1, not 0"),
        ((-1,), "length must be an int of at least 1, not -1"),
        ((2.5,), "length must be an int of at least 1, not 2.5"),
        (("10",), "length must be an int of at least 1, not '10'"),
        ((10, -5), "dedup_horizon_ms must be an int of at least 0, not -5"),
        ((10, float("nan")), "dedup_horizon_ms must be an int of at least 0, not nan"),
    ],
)
def test_a_store_refuses_a_length_or_horizon_the_settings_refuse(
    args: tuple[object, ...], words: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        MemoryFeatureStore(*args)  # type: ignore[arg-type]


def test_the_settings_bounds_are_taken() -> None:
    store = MemoryFeatureStore(1, 0)
    assert (store.length, store.dedup_horizon_ms) == (1, 0)
