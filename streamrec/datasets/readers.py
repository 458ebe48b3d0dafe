"""Readers that turn public interaction datasets into contract events, in event-time order.

Formats:
- ``taobao``: Alibaba UserBehavior CSV, no header: ``user,item,category,behavior,ts_seconds``.
- ``movielens``: GroupLens ml-latest ``ratings.csv`` with ``movies.csv`` beside it (genres).
- ``ml100k``: GroupLens ML-100K ``u.data`` (tab-separated) with ``u.item`` (pipe-separated).
- ``jsonl``: one contract event per line.

MovieLens ratings become explicit labels: ``label = rating >= positive_rating``.
The files are read whole and sorted by event time (stable), which suits files up to a few
million rows; larger logs should be replayed from Kafka itself.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, TextIO

from streamrec.errors import DatasetError, InvalidEvent
from streamrec.events import Event, parse_event

Format = Literal["auto", "taobao", "movielens", "ml100k", "jsonl"]
FORMATS: tuple[str, ...] = ("auto", "taobao", "movielens", "ml100k", "jsonl")
# The 19 ML-100K genre flags, in u.item column order (the dataset's own u.genre lists them).
ML100K_GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
    "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
    "Romance", "Sci-Fi", "Thriller", "War", "Western",
)
_TAOBAO_ACTIONS = frozenset({"pv", "cart", "fav", "buy"})


def detect_format(path: Path) -> str:
    """Guess the dataset format from the file name and its first line."""
    if path.is_dir():
        if (path / "ratings.csv").exists():
            return "movielens"
        if (path / "u.data").exists():
            return "ml100k"
        raise DatasetError(f"{path}: a directory must hold ratings.csv or u.data")
    if path.name == "ratings.csv":
        return "movielens"
    if path.name == "u.data":
        return "ml100k"
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    with _open(path) as fh:
        first = fh.readline().strip().split(",")
    if len(first) == 5 and first[3] in _TAOBAO_ACTIONS:
        return "taobao"
    raise DatasetError(f"{path}: cannot tell the format; pass --format")


def read_events(
    path: Path, fmt: str = "auto", *, positive_rating: float = 4.0, limit: int | None = None
) -> list[Event]:
    """Read a dataset as events sorted by event time (stable), at most ``limit`` of them.

    ``limit`` keeps the *earliest* events, so a limited replay is a prefix of the full one.
    """
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file or directory")
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "taobao":
        events = list(_taobao(path))
    elif fmt == "movielens":
        events = list(_movielens(path, positive_rating))
    elif fmt == "ml100k":
        events = list(_ml100k(path, positive_rating))
    elif fmt == "jsonl":
        events = list(_jsonl(path))
    else:
        raise DatasetError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    events.sort(key=lambda e: e.ts)
    return events if limit is None else events[:limit]


def _open(path: Path, encoding: str = "utf-8") -> TextIO:
    try:
        return path.open(encoding=encoding, newline="")
    except OSError as exc:
        raise DatasetError(f"{path}: {exc.strerror}") from exc


def _taobao(path: Path) -> Iterator[Event]:
    with _open(path) as fh:
        for line_no, row in enumerate(csv.reader(fh), start=1):
            if not row:
                continue
            try:
                user, item, category, action, ts = row
                yield Event(f"tb{line_no}", user, item, category, action, int(ts) * 1000)
            except ValueError as exc:
                raise DatasetError(f"{path}:{line_no}: not a Taobao row: {row!r}") from exc


def _movielens(path: Path, positive_rating: float) -> Iterator[Event]:
    ratings = path / "ratings.csv" if path.is_dir() else path
    movies = ratings.parent / "movies.csv"
    genres: dict[str, str] = {}
    if movies.exists():
        with _open(movies) as fh:
            genres = {row["movieId"]: row["genres"] for row in csv.DictReader(fh)}
    with _open(ratings) as fh:
        for line_no, row in enumerate(csv.DictReader(fh), start=2):
            try:
                user, movie = row["userId"], row["movieId"]
                label = int(float(row["rating"]) >= positive_rating)
                ts = int(row["timestamp"]) * 1000
            except (KeyError, TypeError, ValueError) as exc:
                raise DatasetError(f"{ratings}:{line_no}: not a MovieLens rating: {row}") from exc
            category = genres.get(movie, "(no genres listed)")
            yield Event(f"ml{user}-{movie}", user, movie, category, "rate", ts, label)


def _ml100k(path: Path, positive_rating: float) -> Iterator[Event]:
    data = path / "u.data" if path.is_dir() else path
    items = data.parent / "u.item"
    genres: dict[str, str] = {}
    if items.exists():
        # u.item is Latin-1 encoded (film titles with accents).
        with _open(items, encoding="latin-1") as fh:
            for row in csv.reader(fh, delimiter="|"):
                flags = row[-len(ML100K_GENRES):]
                names = [g for g, flag in zip(ML100K_GENRES, flags, strict=True) if flag == "1"]
                genres[row[0]] = "|".join(names) or "unknown"
    with _open(data) as fh:
        for line_no, row in enumerate(csv.reader(fh, delimiter="\t"), start=1):
            try:
                user, movie, rating, ts = row
                label = int(float(rating) >= positive_rating)
            except ValueError as exc:
                raise DatasetError(f"{data}:{line_no}: not an ML-100K rating: {row!r}") from exc
            category = genres.get(movie, "unknown")
            yield Event(f"ml{user}-{movie}", user, movie, category, "rate", int(ts) * 1000, label)


def _jsonl(path: Path) -> Iterator[Event]:
    with _open(path) as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                # Recorded events are in the past: no future-time limit applies here.
                yield parse_event(
                    line.encode(), now_ms=2**62, max_future_ms=0, max_bytes=1 << 20
                )
            except InvalidEvent as exc:
                raise DatasetError(f"{path}:{line_no}: {exc}") from exc
