"""Settings that no client or server can take are refused as they are read, by name; a store
type or a key that names nothing is said as its setting.

Found by the settings tour: ``STREAMREC_STORE__CONNECT_TIMEOUT_S=1e300`` was an
``OverflowError`` traceback at the consumers' first connection, ``STREAMREC_STORE__TTL_S=1e16``
failed the first batch in Redis ("value is not an integer or out of range"), and
``STREAMREC_KAFKA__SESSION_TIMEOUT_MS`` above librdkafka's range (or above
``max.poll.interval.ms``) a ``KafkaException`` traceback as the consumers and the learner made
their clients.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from streamrec.config import StreamrecConfig, load_config
from streamrec.config.loading import fields_of, is_section
from streamrec.config.section import MAX_SECONDS
from streamrec.errors import ConfigError
from streamrec.kafka.clients import consumer_config


def _durations() -> list[tuple[str, str]]:
    """Every duration in seconds of every section, as (section, setting)."""
    return [
        (section, name)
        for section, annotation in fields_of(StreamrecConfig).items()
        if is_section(annotation)
        for name, kind in fields_of(annotation).items()
        if name.endswith("_s") and kind in (int, float, float | None)
    ]


def test_there_are_durations_to_check() -> None:
    assert ("store", "ttl_s") in _durations() and ("store", "connect_timeout_s") in _durations()
    assert len(_durations()) >= 15


@pytest.mark.parametrize(("section", "name"), _durations(), ids=lambda x: str(x))
def test_a_duration_past_a_century_is_refused_by_name(section: str, name: str) -> None:
    with pytest.raises(ConfigError, match=f"STREAMREC_{section.upper()}__{name.upper()}"):
        load_config(None, **{section: {name: MAX_SECONDS + 1}})


def test_a_century_is_taken() -> None:
    cfg = load_config(store={"ttl_s": MAX_SECONDS, "connect_timeout_s": MAX_SECONDS})
    assert cfg.store.ttl_s == MAX_SECONDS  # type: ignore[union-attr]  # the Redis store's


@pytest.mark.parametrize(
    ("session_ms", "client"),
    [(3_600_001, {"max.poll.interval.ms": 3_600_001}), (300_001, {}), (6000, {"max.poll.interval.ms": 5000})],
    ids=["past librdkafka's range", "past the default poll interval", "past the client's poll interval"],
)
def test_a_session_timeout_the_consumer_refuses_is_refused_by_name(
    session_ms: int, client: dict[str, int]
) -> None:
    with pytest.raises(ConfigError, match="STREAMREC_KAFKA__SESSION_TIMEOUT_MS"):
        load_config(kafka={"session_timeout_ms": session_ms, "client": client})


@pytest.mark.parametrize(
    ("session_ms", "client"),
    [
        (300_000, {}),
        (3_600_000, {"max.poll.interval.ms": 3_600_000}),
        (6000, {"max.poll.interval.ms": "6000"}),  # the client's options may be strings
    ],
)
def test_a_session_timeout_taken_makes_a_consumer(session_ms: int, client: dict[str, object]) -> None:
    cfg = load_config(kafka={"session_timeout_ms": session_ms, "client": client})
    Consumer(consumer_config(cfg.kafka, "g")).close()  # made, not connected: librdkafka checks the options


def test_an_unknown_store_type_names_its_variable_and_the_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the settings tour: ``STREAMREC_STORE__TYPE=Redis`` was "invalid setting
    STREAMREC_STORE (or its flag or streamrec.toml entry): Input tag 'Redis' found using
    _store_type() does not match ...": neither the variable nor where it was set, and a private
    function's name.
    """
    monkeypatch.setenv("STREAMREC_STORE__TYPE", "Redis")
    with pytest.raises(ConfigError) as caught:
        load_config()
    assert str(caught.value) == (
        "invalid setting STREAMREC_STORE__TYPE (from the environment): 'Redis' is no "
        "feature store: one of 'redis', 'memory'"
    )


def test_an_unknown_store_type_in_the_settings_file_names_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[store]\ntype = "mem"\n')
    with pytest.raises(ConfigError, match=re.escape(f"STREAMREC_STORE__TYPE (from {path} [store] type)")):
        load_config(path)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "[consumer]\nbatchsize = 10\n",
            "STREAMREC_CONSUMER__BATCHSIZE names no setting (from {path} [consumer] batchsize)",
        ),
        ("[consumr]\nbatch_size = 10\n", "STREAMREC_CONSUMR names no setting (from {path} consumr)"),
        ("batch_size = 10\n", "STREAMREC_BATCH_SIZE names no setting (from {path} batch_size)"),
    ],
    ids=["setting", "section", "top level"],
)
def test_an_unknown_key_in_the_settings_file_is_named_as_no_setting(
    text: str, named: str, tmp_path: Path
) -> None:
    """Found by the settings tour: ``[consumr]`` was "invalid setting STREAMREC_ (key 'consumr')
    ...: Extra inputs are not permitted", a variable of no name.
    """
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(named.format(path=path)), str(caught.value)
    assert "docs/reference/configuration.md" in str(caught.value)


def test_a_check_across_a_section_names_the_setting_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Left by the settings tour: a check of one setting against another of its section said
    "invalid setting STREAMREC_KAFKA (or its flag or streamrec.toml entry): STREAMREC_KAFKA__...",
    the section as if it were the setting, and a guess at where it was set.
    """
    monkeypatch.setenv("STREAMREC_KAFKA__SESSION_TIMEOUT_MS", "400000")
    with pytest.raises(ConfigError) as caught:
        load_config()
    assert str(caught.value).startswith(
        "invalid setting STREAMREC_KAFKA__SESSION_TIMEOUT_MS (400000) is above the consumers' "
        "max.poll.interval.ms"
    ), str(caught.value)


@pytest.mark.parametrize(("store", "key", "owner"), [("memory", "URL", "redis"), ("redis", "SHARDS", None)])
def test_a_setting_of_another_store_type_says_whose_it_is(
    store: str, key: str, owner: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left by the settings tour: ``STREAMREC_STORE__TYPE=memory`` with a URL was "invalid
    setting STREAMREC_STORE__URL ...: Extra inputs are not permitted" (pydantic's words).
    """
    monkeypatch.setenv("STREAMREC_STORE__TYPE", store)
    monkeypatch.setenv(f"STREAMREC_STORE__{key}", "redis://127.0.0.1:1")
    with pytest.raises(ConfigError) as caught:
        load_config()
    said = str(caught.value)
    assert "Extra inputs" not in said, said
    if owner is None:
        assert said.startswith(f"STREAMREC_STORE__{key} names no setting"), said
    else:
        assert said.startswith(
            f"STREAMREC_STORE__{key} is a setting of the {owner} store, not of the {store} store "
            "(STREAMREC_STORE__TYPE)"
        ), said


def test_more_negatives_than_any_practice_are_refused_by_name() -> None:
    """Found by the consumers tour: ``STREAMREC_CONSUMER__NEGATIVES=100000`` was taken, and one
    batch then drew for minutes (the draw checks each pick against those before it: quadratic)
    while holding hundreds of millions of samples, deaf to SIGTERM until it was done.
    """
    refused = r"STREAMREC_CONSUMER__NEGATIVES .*100,000 is more than the 100 a positive"
    with pytest.raises(ConfigError, match=refused):
        load_config(None, consumer={"negatives": 100_000})
    with pytest.raises(ConfigError, match="STREAMREC_CONSUMER__NEGATIVES"):
        load_config(None, consumer={"negatives": 101})
    assert load_config(None, consumer={"negatives": 100}).consumer.negatives == 100
