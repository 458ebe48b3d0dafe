"""Readers that turn public interaction datasets into contract events, in event-time order.

Formats:
- ``taobao``: Alibaba UserBehavior CSV, no header: ``user,item,category,behavior,ts_seconds``.
- ``movielens``: GroupLens ml-latest ``ratings.csv`` with ``movies.csv`` beside it (genres).
- ``ml100k``: GroupLens ML-100K ``u.data`` (tab-separated) with ``u.item`` (pipe-separated).
- ``jsonl``: one contract event per line.

MovieLens ratings become explicit labels: ``label = rating >= positive_rating``.

Beside the contract's fields, the MovieLens readers give each event the fields a deployment
may declare as features (`MOVIELENS_FIELDS`): ``genres`` (ids: the movie's genres),
``year`` (a number: the release year in the title, absent when it has none) and ``rating``
(a number: the rating itself, to declare as a behaviour *outcome*: never for the target, whose
rating is its label), and the rater's history before it, ``user_ratings`` and
``user_mean_rating`` (`streamrec.datasets.user_history`, to declare with role ``user``). A
JSONL line's top-level fields are its declared features, as on the events topic. With a schema
(`read_events`'s ``schema``) each event carries the values of its declared extras
(`streamrec.datasets.declared`); without, none: the events are the contract's.

The files are read whole and sorted by event time (stable), which suits files up to a few
million rows; larger logs should be replayed from Kafka itself.
"""

from __future__ import annotations

import csv
import gzip
import logging
import re
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, TextIO

import orjson

from streamrec.datasets.declared import declare
from streamrec.datasets.user_history import USER_HISTORY_FIELDS, so_far
from streamrec.errors import DatasetError, InvalidEvent
from streamrec.events import MIN_TS_MS, Event, parse_event
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.wording import plural

logger = logging.getLogger(__name__)

Format = Literal["auto", "taobao", "movielens", "ml100k", "jsonl"]
FORMATS: tuple[str, ...] = ("auto", "taobao", "movielens", "ml100k", "jsonl")
_GZIP_MAGIC = b"\x1f\x8b"
_ML_COLUMNS = ("userId", "movieId", "rating", "timestamp")  # ratings.csv's header (more may follow)
#: The event contract's fields (`streamrec.events`): a JSONL line's others are its features.
CONTRACT_FIELDS = ("event_id", "user_id", "item_id", "category_id", "action", "ts", "label")
# The 19 ML-100K genre flags, in u.item column order (the dataset's own u.genre lists them).
ML100K_GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
    "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
    "Romance", "Sci-Fi", "Thriller", "War", "Western",
)
_TAOBAO_ACTIONS = frozenset({"pv", "cart", "fav", "buy"})
#: The fields the MovieLens readers give an event beside the contract's, to declare as features.
MOVIELENS_FIELDS = ("genres", "year", "rating", *USER_HISTORY_FIELDS)
# "Heat (1995)", "Babylon 5 (1994) ", "Fawlty Towers (1975-1979)": the year the title ends with.
_YEAR = re.compile(r"\((\d{4})(?:[-\u2013]\d{4})?\)\s*$")
# ML-100K: "01-Jan-1995", the release date's year.
_DATE_YEAR = re.compile(r"(\d{4})\s*$")
NO_GENRES = "(no genres listed)"

#: An event and its other top-level fields (what its JSON would carry beside the contract's).
Row = tuple[Event, dict[str, object]]
# Where a reader appends each event's other fields, in step with the events; None: not read.
_Sink = list[dict[str, object]] | None


def detect_format(path: str | Path) -> str:
    """Guess the dataset format from the file name and its first line (an object: JSON lines)."""
    path = Path(path)  # a str too, as read_events takes
    if path.is_dir():
        if (path / "ratings.csv").exists():
            return "movielens"
        if (path / "u.data").exists():
            return "ml100k"
        raise DatasetError(f"{path}: a directory must hold ratings.csv or u.data")
    name = Path(path.name.removesuffix(".gz"))  # a gzip file: the name of the file it holds
    if name.name == "ratings.csv":
        return "movielens"
    if name.name == "u.data":
        return "ml100k"
    if name.suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    with _open(path) as fh:
        line = fh.readline().strip()
    if line.startswith("{"):  # an event object: JSON lines under another name (`generate x.csv`)
        return "jsonl"
    first = line.split(",")
    if len(first) == 5 and first[3] in _TAOBAO_ACTIONS:
        return "taobao"
    raise DatasetError(f"{path}: cannot tell the format; pass --format")


def read_events(
    path: Path,
    fmt: str = "auto",
    *,
    positive_rating: float = 4.0,
    limit: int | None = None,
    schema: FeatureSchema | None = None,
) -> list[Event]:
    """Read a dataset as events sorted by event time (stable), at most ``limit`` of them.

    ``limit`` keeps the *earliest* events, so a limited replay is a prefix of the full one.
    With ``schema``, each event carries the values of the schema's extras its fields hold.

    Raises:
        DatasetError: the file is missing or not of its format, or a field breaks its
            declaration (``path:line`` and the feature named).
    """
    specs = () if schema is None else schema.extras
    if not specs:  # the events alone: no fields read, kept or paired (100,004 ratings in 0.7 s)
        events = _read(Path(path), fmt, positive_rating, None)
        events.sort(key=lambda e: e.ts)
        _say_unread(Path(path), fmt, specs)  # once read: every line is an event
        return events if limit is None else events[:limit]
    rows = read_rows(path, fmt, positive_rating=positive_rating)
    rows.sort(key=lambda row: row[0].ts)
    rows = rows if limit is None else rows[:limit]
    source = str(path)
    declared = [declare(event, fields, specs, source) for event, fields in rows]
    _say_unread(Path(path), fmt, specs)
    return declared


def _say_unread(path: Path, fmt: str, specs: Sequence[FeatureSpec]) -> None:
    """Warn of a JSONL file's top-level fields that neither the contract nor ``specs`` read.

    They reach no record and no sample: ``produce`` publishes the contract's fields and the
    declared features', a backtest reads no other. Said once, each with how many events carry it.
    """
    if not path.is_file() or (fmt if fmt != "auto" else detect_format(path)) != "jsonl":
        return
    read = {*CONTRACT_FIELDS, *(spec.source for spec in specs)}
    unread: Counter[str] = Counter()
    events = 0
    with _open(path) as fh:
        for line in fh:
            if line.strip():
                events += 1
                doc = orjson.loads(line)  # the events were read: each line is an object
                unread.update(name for name in doc if name not in read)
    if unread:
        of_all = plural(events, "event")
        named = ", ".join(f"{name} ({count} of {of_all})" for name, count in sorted(unread.items()))
        logger.warning(
            "%s: fields no declared feature reads, so neither published nor replayed: %s; declare them "
            "(STREAMREC_FEATURES) to keep them", path, named,
        )


def read_rows(
    path: Path, fmt: str = "auto", *, positive_rating: float = 4.0, fields: bool = True
) -> list[Row]:
    """Each event of a dataset with its other fields, in file order (``fields=False``: none)."""
    if not fields:
        return [(event, {}) for event in _read(Path(path), fmt, positive_rating, None)]
    found: list[dict[str, object]] = []
    events = _read(Path(path), fmt, positive_rating, found)
    return list(zip(events, found, strict=True))


def _read(path: Path, fmt: str, positive_rating: float, fields: _Sink) -> list[Event]:
    """The events of a dataset in file order; each one's other fields appended to ``fields``."""
    if not path.exists():
        raise DatasetError(f"{path}: no such file or directory")
    try:
        return _read_format(path, fmt, positive_rating, fields)
    except UnicodeDecodeError as exc:  # a Latin-1 or UTF-16 export: one line, not a traceback
        bad = exc.object[exc.start]
        raise DatasetError(f"{path}: not UTF-8 text (byte 0x{bad:02x}): save it as UTF-8") from exc
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:  # cut short, or bytes changed
        raise DatasetError(f"{path}: a damaged gzip file ({exc}): compress it again") from exc


def _read_format(path: Path, fmt: str, positive_rating: float, fields: _Sink) -> list[Event]:
    """`_read` of a path that exists."""
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "taobao":
        events = list(_taobao(path))
        if fields is not None:
            fields += [{} for _ in events]
        return events
    if fmt in ("movielens", "ml100k"):
        read = _movielens if fmt == "movielens" else _ml100k
        events = list(read(path, positive_rating, fields))
        if fields is not None:
            so_far(events, fields)
        return events
    if fmt == "jsonl":
        return list(_jsonl(path, fields))
    raise DatasetError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


def _open(path: Path, encoding: str = "utf-8-sig") -> TextIO:
    """``path`` as text; UTF-8 drops a leading byte order mark (Excel's "CSV UTF-8" writes one).

    A gzip file (by its first bytes, whatever its name) reads as the file it holds.
    """
    try:
        with path.open("rb") as fh:
            zipped = fh.read(2) == _GZIP_MAGIC
        if zipped:
            return gzip.open(path, "rt", encoding=encoding, newline="")
        return path.open(encoding=encoding, newline="")
    except OSError as exc:
        raise DatasetError(f"{path}: {exc.strerror or exc}") from exc


def _taobao(path: Path) -> Iterator[Event]:
    with _open(path) as fh:
        for line_no, row in enumerate(csv.reader(fh), start=1):
            if not row:
                continue
            try:
                user, item, category, action, ts = row
                ms = _seconds_to_ms(int(ts), f"{path}:{line_no}", "ts")
                event = Event(f"tb{line_no}", user, item, category, action, ms)
            except ValueError as exc:
                raise DatasetError(f"{path}:{line_no}: not a Taobao row: {row!r}") from exc
            yield _contract(event, f"{path}:{line_no}", row)


def _movielens(path: Path, positive_rating: float, fields: _Sink) -> Iterator[Event]:
    ratings = path / "ratings.csv" if path.is_dir() else path
    movies = ratings.parent / "movies.csv"
    genres: dict[str, str] = {}
    known: dict[str, dict[str, object]] = {}
    if movies.exists():
        with _open(movies) as fh:
            for row in csv.DictReader(fh):
                genres[row["movieId"]] = row["genres"]
                known[row["movieId"]] = _movie_fields(row["genres"].split("|"), _YEAR.search(row["title"]))
    else:
        _no_movies(movies, NO_GENRES)
    with _open(ratings) as fh:
        rows = csv.DictReader(fh)
        if rows.fieldnames is not None and not set(_ML_COLUMNS) <= set(rows.fieldnames):  # None: empty
            raise DatasetError(
                f"{ratings}:1: not a MovieLens ratings header: expected the columns "
                f"{', '.join(_ML_COLUMNS)}, got {', '.join(rows.fieldnames)[:200]}"
            )
        for line_no, row in enumerate(rows, start=2):
            try:
                user, movie = row["userId"], row["movieId"]
                rating = float(row["rating"])
                ts = _seconds_to_ms(int(row["timestamp"]), f"{ratings}:{line_no}", "timestamp")
            except (KeyError, TypeError, ValueError) as exc:
                raise DatasetError(f"{ratings}:{line_no}: not a MovieLens rating: {row}") from exc
            category = genres.get(movie, NO_GENRES)
            label = int(rating >= positive_rating)
            event = _contract(Event(f"ml{user}-{movie}", user, movie, category, "rate", ts, label),
                              f"{ratings}:{line_no}", row)
            if fields is not None:
                fields.append({**known.get(movie, {}), "rating": rating})
            yield event


def _no_movies(movies: Path, category: str) -> None:
    """Warn that ``movies`` is missing: every rating's category is then ``category``, a constant."""
    logger.warning(
        "%s not found beside the ratings: no genres or years, every rating's category is %r",
        movies, category,
    )


def _seconds_to_ms(seconds: int, where: str, column: str) -> int:
    """Epoch milliseconds of a dataset's epoch-seconds ``column`` (Taobao's, MovieLens's).

    Raises:
        DatasetError: ``where``: the value is milliseconds or finer (1e11 s is the year 5138),
            where the contract's check would say "after the year 9999: send milliseconds".
    """
    if seconds >= MIN_TS_MS:
        raise DatasetError(
            f"{where}: {column} {seconds} looks like milliseconds or finer: this format's times are "
            "epoch seconds; divide them by 1000"
        )
    return seconds * 1000


def _contract(event: Event, where: str, row: object) -> Event:
    """``event`` when it keeps the event contract, checked as the consumers check a record.

    A row that breaks it (an empty or over-long id, a time before 1973) stops the read at its
    line, as a JSONL line does: the consumers would dead-letter it, and a prepared file with such
    a row is read as the wrong format or is itself wrong, which a count at the end would hide.

    Raises:
        DatasetError: ``where`` (``path:line``), what breaks the contract, and the ``row``.
    """
    try:
        # Recorded events are in the past: no future-time limit applies here.
        parse_event(event.to_json(), now_ms=2**62, max_future_ms=0, max_bytes=1 << 20)
    except InvalidEvent as exc:
        raise DatasetError(f"{where}: {exc}: {row!r}") from exc
    return event


def _movie_fields(genres: Sequence[str], year: re.Match[str] | None) -> dict[str, object]:
    """A movie's fields: its genres (none for "(no genres listed)") and release year (if known)."""
    out: dict[str, object] = {}
    named = [g for g in genres if g and g != NO_GENRES and g != "unknown"]
    if named:
        out["genres"] = named
    if year is not None:
        out["year"] = float(year.group(1))
    return out


def _ml100k(path: Path, positive_rating: float, fields: _Sink) -> Iterator[Event]:
    data = path / "u.data" if path.is_dir() else path
    items = data.parent / "u.item"
    genres: dict[str, str] = {}
    known: dict[str, dict[str, object]] = {}
    if items.exists():
        # u.item is Latin-1 encoded (film titles with accents).
        with _open(items, encoding="latin-1") as fh:
            for row in csv.reader(fh, delimiter="|"):
                flags = row[-len(ML100K_GENRES):]
                names = [g for g, flag in zip(ML100K_GENRES, flags, strict=True) if flag == "1"]
                genres[row[0]] = "|".join(names) or "unknown"
                year = _YEAR.search(row[1]) or _DATE_YEAR.search(row[2])
                known[row[0]] = _movie_fields(names, year)
    else:
        _no_movies(items, "unknown")
    with _open(data) as fh:
        for line_no, row in enumerate(csv.reader(fh, delimiter="\t"), start=1):
            try:
                user, movie, text, seconds = row
                rating, ts = float(text), _seconds_to_ms(int(seconds), f"{data}:{line_no}", "timestamp")
            except ValueError as exc:
                raise DatasetError(f"{data}:{line_no}: not an ML-100K rating: {row!r}") from exc
            category = genres.get(movie, "unknown")
            label = int(rating >= positive_rating)
            event = _contract(
                Event(f"ml{user}-{movie}", user, movie, category, "rate", ts, label),
                f"{data}:{line_no}", row,
            )
            if fields is not None:
                fields.append({**known.get(movie, {}), "rating": rating})
            yield event


def _jsonl(path: Path, fields: _Sink) -> Iterator[Event]:
    with _open(path) as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            raw = line.encode()
            try:
                # Recorded events are in the past: no future-time limit applies here.
                event = parse_event(raw, now_ms=2**62, max_future_ms=0, max_bytes=1 << 20)
            except InvalidEvent as exc:
                raise DatasetError(f"{path}:{line_no}: {exc}") from exc
            # The declared fields are the line's top-level ones, as on the events topic; read
            # only when a schema declares some (the contract's own parse is the C decoder's).
            if fields is not None:
                fields.append(orjson.loads(raw))
            yield event
