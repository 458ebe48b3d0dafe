"""One way to name any event source: a dataset path, or the seeded click generator.

``synthetic`` or ``synthetic:events=50000,users=2000,seed=7`` names a generated stream (the
fields of `ClickStreamSpec`); anything else is a path
read by `read_events`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from streamrec.datasets.readers import detect_format, read_events
from streamrec.datasets.synthetic import ClickStreamSpec, generate_clicks
from streamrec.errors import ConfigError, DatasetError, FieldError
from streamrec.events import Event
from streamrec.features import FeatureSchema

SYNTHETIC = "synthetic"
RATING_FORMATS = ("movielens", "ml100k")
DEFAULT_POSITIVE_RATING = 4.0


def positive_rating_for(source: str | Path, fmt: str, given: float | None) -> float:
    """The rating threshold to read ``source`` with: ``given`` (``--positive-rating``) or 4.

    Raises:
        ConfigError: ``given`` for a source without ratings (it would do nothing), or off the
            rating scale (nan, or outside (0, 5]: every label one value).
        DatasetError: the format of ``source`` cannot be told.
    """
    if given is None:
        return DEFAULT_POSITIVE_RATING
    generated = str(source).split(":", 1)[0] == SYNTHETIC
    kind = "generated" if generated else fmt if fmt != "auto" else detect_format(source)
    if kind not in RATING_FORMATS:
        raise ConfigError(
            f"--positive-rating is for MovieLens and ML-100K ratings: {source} is {kind}, without "
            "ratings; leave it out"
        )
    if not 0 < given <= 5:  # nan too
        raise ConfigError(
            f"--positive-rating must be on the rating scale, above 0 and at most 5 (MovieLens rates "
            f"0.5-5), not {given}: past it every event would be published with one label"
        )
    return given


def load_events(
    source: str | Path,
    fmt: str = "auto",
    *,
    positive_rating: float = 4.0,
    limit: int | None = None,
    schema: FeatureSchema | None = None,
    to_replay: bool = False,
) -> list[Event]:
    """The events of ``source`` in event-time order, at most the earliest ``limit``.

    Args:
        source: A dataset file (Taobao UserBehavior, MovieLens, ML-100K or JSONL), or
            ``synthetic[:field=value,...]`` for a generated stream.
        fmt: The file's format, or ``auto`` to detect it.
        positive_rating: For rating datasets, the lowest rating that counts as a positive.
        limit: At most this many events (the earliest); not below 0.
        schema: The deployment's features: each event carries the values of its declared
            extras (a dataset's fields, a generated stream's context); None: none.
        to_replay: Refuse a source of no events (a backtest, demo or publishing of nothing).

    Raises:
        ConfigError: a negative ``limit``; ``fmt`` other than ``auto`` for a generated stream
            (a format is a file's); with ``to_replay``, no events.
        DatasetError: the file cannot be read, or a line of it is not an event of its format.

    Examples:
        >>> events = load_events("synthetic:events=5,users=2,seed=3")
        >>> len(events), events[0].event_id
        (5, 'g3-0')
    """
    if limit is not None and limit < 0:  # a slice would drop the latest events instead
        raise ConfigError(f"--limit must be a number of events, 0 or more, not {limit}")
    if str(source).split(":", 1)[0] == SYNTHETIC:
        if fmt != "auto":  # it was ignored without a word
            raise ConfigError(f"--format {fmt} is for a file: {source} is generated; leave --format out")
        events = generate_clicks(synthetic_spec(str(source)), schema)
        events = events if limit is None else events[:limit]
    else:
        events = read_events(Path(source), fmt, positive_rating=positive_rating, limit=limit, schema=schema)
    if to_replay and not events:
        why = "--limit 0 leaves no events" if limit == 0 else "no events"
        raise ConfigError(f"{source}: {why} to replay or publish")
    return events


def synthetic_spec(source: str) -> ClickStreamSpec:
    """The spec ``synthetic[:field=value,...]`` names.

    Raises:
        DatasetError: An unknown field, a value of the wrong type, or one out of range.
    """
    _, _, options = source.partition(":")
    # actions is a tuple: not settable from a source string, so neither accepted nor offered
    fields = {f.name: f for f in dataclasses.fields(ClickStreamSpec) if f.name != "actions"}
    values: dict[str, int | float] = {}
    for option in filter(None, options.split(",")):
        name, _, text = option.partition("=")
        name = name.strip()
        if name not in fields:
            raise DatasetError(f"{source}: unknown field {name!r}; expected one of {', '.join(fields)}")
        try:
            values[name] = float(text) if fields[name].type in (float, "float") else int(text)
        except ValueError as exc:
            raise DatasetError(f"{source}: {name}={text!r} is not a number") from exc
    try:
        return dataclasses.replace(ClickStreamSpec(), **values)  # type: ignore[arg-type]  # checked above
    except FieldError as exc:  # a value out of range, named by its key in the source
        raise DatasetError(f"{source}: {exc.naming(str)}") from exc
