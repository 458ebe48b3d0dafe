"""Dataset readers on the bundled MovieLens, files written here, and the real Taobao file
in ../shared/data when present (extra coverage only).
"""

from __future__ import annotations

import csv
import gzip
import re
from pathlib import Path

import orjson
import pytest

from streamrec.datasets import detect_format, read_events
from streamrec.datasets.readers import read_rows
from streamrec.errors import DatasetError
from streamrec.events import Event
from streamrec.features import FeatureSchema, FeatureSpec


@pytest.fixture(scope="module")
def taobao(taobao_path: Path):
    return read_events(taobao_path)


def test_taobao_all_rows_in_event_time_order(taobao) -> None:
    assert len(taobao) == 84_287
    assert all(a.ts <= b.ts for a, b in zip(taobao, taobao[1:], strict=False))
    assert len({e.event_id for e in taobao}) == len(taobao)
    assert {e.action for e in taobao} == {"pv", "cart", "fav", "buy"}
    assert all(e.label is None for e in taobao)


def test_movielens_explicit_labels_and_genres(movielens_path: Path) -> None:
    events = read_events(movielens_path)
    assert len(events) == 100_004
    # Counted from the raw file, independently of the reader: ratings >= 4 are the positives.
    with (movielens_path / "ratings.csv").open() as fh:
        raw = {f"ml{r['userId']}-{r['movieId']}": float(r["rating"]) for r in csv.DictReader(fh)}
    assert {e.event_id: e.label for e in events} == {k: int(v >= 4.0) for k, v in raw.items()}
    assert sum(e.label or 0 for e in events) == 51_568
    assert next(e for e in events if e.event_id == "ml1-31").label == 0  # user 1 rated it 2.5
    toy_story = next(e for e in events if e.item_id == "1")
    assert toy_story.category_id == "Adventure|Animation|Children|Comedy|Fantasy"
    assert all(a.ts <= b.ts for a, b in zip(events, events[1:], strict=False))


def test_limit_keeps_the_earliest_events(movielens_path: Path) -> None:
    events = read_events(movielens_path, limit=100)
    full = read_events(movielens_path)
    assert events == full[:100]


def test_ml100k_tab_and_pipe_files(tmp_path: Path) -> None:
    # The ML-100K layout, written here in its own format from the bundled ratings.
    (tmp_path / "u.data").write_text("196\t242\t3\t881250949\n186\t302\t4\t891717742\n")
    flags = ["0"] * 19
    flags[5] = "1"  # Comedy
    (tmp_path / "u.item").write_text(
        "242|Kolya (1996)|24-Jan-1997||http://x|" + "|".join(flags) + "\n", encoding="latin-1"
    )
    assert detect_format(tmp_path) == "ml100k"
    events = read_events(tmp_path)
    assert [(e.user_id, e.item_id, e.label, e.category_id) for e in events] == [
        ("196", "242", 0, "Comedy"),
        ("186", "302", 1, "unknown"),
    ]


def test_jsonl_round_trip_and_line_numbers_in_errors(tmp_path: Path, movielens_path: Path) -> None:
    events = read_events(movielens_path, limit=5)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(e.to_json() for e in reversed(events)) + b"\n")
    back = read_events(path)
    assert sorted(back, key=lambda e: e.event_id) == sorted(events, key=lambda e: e.event_id)
    assert [e.ts for e in back] == sorted(e.ts for e in back)
    path.write_bytes(events[0].to_json() + b"\n{\"user_id\": 1}\n")
    with pytest.raises(DatasetError, match=r"events.jsonl:2: missing field"):
        read_events(path)


def test_unknown_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b\n")
    with pytest.raises(DatasetError, match="cannot tell the format"):
        read_events(path)
    with pytest.raises(DatasetError, match="no such file"):
        read_events(tmp_path / "missing.csv")


def test_json_lines_under_another_name_are_read_as_json_lines(tmp_path: Path) -> None:
    """Found by a tour: ``generate clicks.csv`` wrote JSON lines that ``produce clicks.csv`` and
    the backtest then could not tell ("cannot tell the format; pass --format").
    """
    path = tmp_path / "clicks.csv"
    path.write_text(Event("e1", "u1", "i1", "c1", "pv", 1_700_000_000_000).to_json().decode() + "\n")
    assert detect_format(path) == "jsonl"
    assert [e.event_id for e in read_events(path)] == ["e1"]


def features_of(event: Event) -> object:
    """The event's declared features, as a dict."""
    return dict(event.features)


# --- declared features ------------------------------------------------------------------------

MOVIELENS_SCHEMA = FeatureSchema.of([
    FeatureSpec(name="genres", kind="ids", max_ids=10),
    FeatureSpec(name="year", kind="number", transform="standardize"),
    FeatureSpec(name="rating", kind="number", outcome=True),
])


def test_movielens_fields_genres_year_and_rating(movielens_path: Path) -> None:
    rows = {event.event_id: fields for event, fields in read_rows(movielens_path)}
    assert len(rows) == 100_004
    # user 1 rated Dangerous Minds (1995), a Drama, 2.5
    movie = {n: v for n, v in rows["ml1-31"].items() if not n.startswith("user_")}
    assert movie == {"genres": ["Drama"], "year": 1995.0, "rating": 2.5}
    toy_story = next(f for k, f in rows.items() if k.endswith("-1"))
    assert toy_story["genres"] == ["Adventure", "Animation", "Children", "Comedy", "Fantasy"]
    # "Hyena Road" has neither a year nor genres: both absent (their defaults downstream)
    hyena = next(f for k, f in rows.items() if k.endswith("-143410"))
    assert set(hyena) == {"rating", "user_ratings", "user_mean_rating"}  # its rater's history: theirs
    # every rating is its own field, and the label is still rating >= 4
    assert all(isinstance(f["rating"], float) for f in rows.values())


def test_without_a_schema_the_events_are_as_before(movielens_path: Path) -> None:
    # the default schema declares nothing: the events carry no features, ids and order as ever
    assert read_events(movielens_path, limit=500, schema=FeatureSchema.default()) == read_events(
        movielens_path, limit=500
    )
    assert read_rows(movielens_path, fields=False)[0][1] == {}


def test_a_schema_declares_the_fields_it_names(movielens_path: Path) -> None:
    events = {e.event_id: e for e in read_events(movielens_path, schema=MOVIELENS_SCHEMA)}
    assert features_of(events["ml1-31"]) == {"genres": ("Drama",), "year": 1995.0, "rating": 2.5}
    year_only = FeatureSchema.of([FeatureSpec(name="year", kind="number")])
    only_year = {e.event_id: e for e in read_events(movielens_path, schema=year_only)}
    assert features_of(only_year["ml1-31"]) == {"year": 1995.0}
    assert features_of(only_year["ml624-143410"]) == {}  # Hyena Road: no year in its title


def test_a_field_breaking_its_declaration_names_the_event_and_feature(movielens_path: Path) -> None:
    schema = FeatureSchema.of([FeatureSpec(name="genres", kind="ids", max_ids=1)])
    with pytest.raises(DatasetError, match=r"event ml\d+-\d+: feature 'genres' .* over its max_ids of 1"):
        read_events(movielens_path, limit=50, schema=schema)


def test_ml100k_fields(tmp_path: Path) -> None:
    (tmp_path / "u.data").write_text("196\t242\t3\t881250949\n")
    flags = ["0"] * 19
    flags[5] = flags[8] = "1"  # Comedy, Drama
    (tmp_path / "u.item").write_text(
        "242|Kolya (1996)|24-Jan-1997||http://x|" + "|".join(flags) + "\n", encoding="latin-1"
    )
    [(event, fields)] = read_rows(tmp_path)
    assert event.category_id == "Comedy|Drama"
    assert fields == {"genres": ["Comedy", "Drama"], "year": 1996.0, "rating": 3.0, "user_ratings": 0.0}


def test_jsonl_declared_fields_are_the_lines_top_level_fields(tmp_path: Path) -> None:
    path = tmp_path / "feed.jsonl"
    line = {"event_id": "e1", "user_id": "u1", "item_id": "i1", "category_id": "c1", "action": "click",
            "ts": 1_700_000_000_000, "device": "ios", "price_cents": 1999, "other": "ignored"}
    path.write_bytes(orjson.dumps(line) + b"\n")
    [(event, fields)] = read_rows(path)
    assert event.event_id == "e1" and fields["device"] == "ios"
    schema = FeatureSchema.of([
        FeatureSpec(name="device", role="context"),
        FeatureSpec(name="price", kind="number", field="price_cents"),
    ])
    [read] = read_events(path, schema=schema)
    assert features_of(read) == {"device": "ios", "price": 1999.0}
    bad = FeatureSchema.of([FeatureSpec(name="device", kind="number", role="context")])
    with pytest.raises(DatasetError, match=r"event e1: feature 'device' .* must be a number"):
        read_events(path, schema=bad)


GOOD_TAOBAO = "1,2,3,pv,1700000000\n"
GOOD_ML100K = "196\t242\t3\t881250949\n"
LONG = "7" * 200  # an id over the contract's 128 characters


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("UserBehavior.csv", GOOD_TAOBAO + "1,,3,pv,1700000500\n", r"UserBehavior.csv:2: .*'item_id'"),
        ("UserBehavior.csv", GOOD_TAOBAO + f"1,{LONG},3,pv,1700000500\n", r"UserBehavior.csv:2: .*'item_id'"),
        ("UserBehavior.csv", GOOD_TAOBAO + "1,2,3,pv,-5\n", r"UserBehavior.csv:2: .*'ts'"),
        # nanoseconds where seconds are due: milliseconds or finer, not "after the year 9999"
        ("UserBehavior.csv", GOOD_TAOBAO + "1,2,3,pv,1700000000000000000\n",
         r"UserBehavior.csv:2: .*looks like milliseconds or finer"),
        ("UserBehavior.csv", GOOD_TAOBAO + "1,2,3,p\x01v,1700000500\n",
         r"UserBehavior.csv:2: .*'action'.*U\+0001"),
        ("u.data", GOOD_ML100K + "\t242\t3\t881250949\n", r"u.data:2: .*'user_id'"),
        # the event id is user-movie: it is the one first over the limit
        ("u.data", GOOD_ML100K + f"196\t{LONG}\t3\t881250949\n", r"u.data:2: field 'event_id' .*'7777"),
        ("ratings.csv", "userId,movieId,rating,timestamp\n1,,4.0,964982703\n", r"ratings.csv:2: .*'item_id'"),
    ],
    ids=["taobao-empty-item", "taobao-long-item", "taobao-negative-ts", "taobao-ns-ts", "taobao-control",
         "ml100k-empty-user", "ml100k-long-item", "movielens-empty-movie"],
)
def test_a_csv_row_breaking_the_event_contract_stops_the_read_at_its_line(
    tmp_path: Path, name: str, text: str, match: str
) -> None:
    # As a JSONL line does: a prepared file with a bad row is read wrong (or is wrong), and the
    # consumers' logic would dead-letter the row, which a backtest must not do silently.
    (tmp_path / name).write_text(text)
    with pytest.raises(DatasetError, match=match):
        read_events(tmp_path / name, "taobao" if name.endswith("Behavior.csv") else "auto")


@pytest.mark.parametrize("ts", ["abc", "891717742.5", ""])
def test_an_ml100k_row_with_a_timestamp_not_an_integer_is_not_a_rating(tmp_path: Path, ts: str) -> None:
    (tmp_path / "u.data").write_text(GOOD_ML100K + f"22\t377\t1\t{ts}\n")
    with pytest.raises(DatasetError, match=r"u.data:2: not an ML-100K rating"):
        read_events(tmp_path / "u.data")


# A UTF-8 byte order mark, as Excel's "CSV UTF-8" and Windows editors write, and CRLF line ends.
BOM = "\ufeff"


@pytest.mark.parametrize(
    ("name", "text", "fmt"),
    [
        ("UserBehavior.csv", "1,100,5,pv,1511658000\r\n1,101,5,buy,1511658060\r\n", "taobao"),
        ("ratings.csv", "userId,movieId,rating,timestamp\r\n1,31,4.5,1260759144\r\n1,32,2,1260759150\r\n",
         "movielens"),
        ("u.data", "1\t31\t5\t881250949\r\n1\t32\t2\t881250950\r\n", "ml100k"),
        ("events.jsonl",
         '{"event_id": "e1", "user_id": "1", "item_id": "100", "category_id": "5", "action": "click",'
         ' "ts": 1511658000000}\r\n'
         '{"event_id": "e2", "user_id": "1", "item_id": "101", "category_id": "5", "action": "click",'
         ' "ts": 1511658060000}\r\n', "jsonl"),
    ],
    ids=["taobao", "movielens", "ml100k", "jsonl"],
)
def test_a_file_opening_with_a_byte_order_mark_reads_as_without(
    tmp_path: Path, name: str, text: str, fmt: str
) -> None:
    """A BOM is not part of the first field: the first user is "1", as on every other line."""
    plain, marked = tmp_path / "plain", tmp_path / "marked"
    for folder, head in ((plain, ""), (marked, BOM)):
        folder.mkdir()
        (folder / name).write_bytes((head + text).encode())
    assert detect_format(marked / name) == fmt
    events = read_events(marked / name)
    assert events == read_events(plain / name)
    assert {e.user_id for e in events} == {"1"}


@pytest.mark.parametrize(
    ("ratings", "text", "beside"),
    [
        ("ratings.csv", "userId,movieId,rating,timestamp\n1,31,4.5,1260759144\n", "movies.csv"),
        ("u.data", "196\t242\t3\t881250949\n", "u.item"),
    ],
    ids=["movielens", "ml100k"],
)
def test_ratings_without_their_movies_file_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, ratings: str, text: str, beside: str
) -> None:
    """Without the movies file every rating's category is one placeholder: a warning says which file."""
    (tmp_path / ratings).write_text(text)
    with caplog.at_level("WARNING", logger="streamrec"):
        [event] = read_events(tmp_path)
    assert event.category_id in ("(no genres listed)", "unknown")
    assert str(tmp_path / beside) in caplog.text


@pytest.mark.parametrize(
    ("name", "line", "fmt"),
    [
        ("events.jsonl", b'{"event_id": "e1", "user_id": "caf\xe9", "item_id": "2", "category_id": "3", '
         b'"action": "click", "ts": 1700000000000}\n', "auto"),
        ("UserBehavior.csv", b"1,caf\xe9,5,pv,1511658000\n", "auto"),
        ("UserBehavior.csv", b"1,caf\xe9,5,pv,1511658000\n", "taobao"),
    ],
    ids=["jsonl", "taobao-auto", "taobao"],
)
def test_a_file_not_in_utf8_is_a_dataset_error_not_a_traceback(
    tmp_path: Path, name: str, line: bytes, fmt: str
) -> None:
    """A Latin-1 file (a tour's "café") raised UnicodeDecodeError up through the CLI."""
    path = tmp_path / name
    path.write_bytes(line)
    with pytest.raises(DatasetError, match=rf"{re.escape(str(path))}: not UTF-8 text \(byte 0xe9\)"):
        read_events(path, fmt)


@pytest.mark.parametrize(
    ("name", "text", "column"),
    [
        ("UserBehavior.csv", "1,100,5,pv,1511658000000\n", "ts"),
        ("ratings.csv", "userId,movieId,rating,timestamp\n1,31,4.5,1260759144000\n", "timestamp"),
        ("u.data", "1\t31\t5\t881250949000\n", "timestamp"),
    ],
    ids=["taobao", "movielens", "ml100k"],
)
def test_milliseconds_where_seconds_are_due_are_named_so(
    tmp_path: Path, name: str, text: str, column: str
) -> None:
    """Found by the replay tour: a Taobao file in milliseconds was said to be "after the year 9999:
    send epoch milliseconds, not micro- or nanoseconds", the advice backwards for a file in seconds.
    """
    (tmp_path / name).write_text(text)
    with pytest.raises(DatasetError, match=rf"{name}:\d: {column} \d+ looks like milliseconds or finer: "
                       r"this format's times are epoch seconds; divide them by 1000"):
        read_events(tmp_path / name)


TAOBAO_ROWS = "1,100,5,pv,1511658000\n2,101,5,buy,1511658060\n"
JSONL_ROWS = (
    '{"event_id": "e1", "user_id": "1", "item_id": "100", "category_id": "5", "action": "click",'
    ' "ts": 1511658000000}\n'
)


@pytest.mark.parametrize(
    ("name", "text"),
    [("UserBehavior.csv", TAOBAO_ROWS), ("events.jsonl", JSONL_ROWS),
     ("ratings.csv", "userId,movieId,rating,timestamp\n1,31,4.5,1260759144\n"),
     ("u.data", "1\t31\t5\t881250949\n")],
    ids=["taobao", "jsonl", "movielens", "ml100k"],
)
def test_a_gzip_file_reads_as_the_file_it_holds(tmp_path: Path, name: str, text: str) -> None:
    """Found by the replay tour: a .gz was 'not UTF-8 text (byte 0x8b): save it as UTF-8'."""
    (tmp_path / name).write_text(text)
    zipped = tmp_path / "z" / f"{name}.gz"
    zipped.parent.mkdir()
    zipped.write_bytes(gzip.compress(text.encode()))
    assert read_events(zipped) == read_events(tmp_path / name)
    assert len(read_events(zipped)) >= 1


@pytest.mark.parametrize("cut", [20, -4])  # into the data; the checksum at its end
def test_a_damaged_gzip_file_is_one_error_naming_it(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "events.jsonl.gz"
    path.write_bytes(gzip.compress((JSONL_ROWS * 200).encode())[:cut])
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(path))}: a damaged gzip file \("):
        read_events(path)


def test_detect_format_takes_a_str_as_read_events_does(tmp_path: Path) -> None:
    # found by the replay tour: detect_format("x.jsonl") raised AttributeError ('str' has no is_dir)
    path = tmp_path / "e.jsonl"
    path.write_text(JSONL_ROWS)
    assert detect_format(str(path)) == "jsonl"


@pytest.mark.parametrize("header", ["user,movie,rating,timestamp", '{"event_id": "e1"'])
def test_a_file_read_as_movielens_without_its_header_is_one_line_naming_the_columns(
    tmp_path: Path, header: str
) -> None:
    # found by the replay tour: --format movielens on JSON lines printed a dict of the split line
    path = tmp_path / "ratings.csv"
    path.write_text(header + "\n1,31,4.5,1260759144\n")
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(path))}:1: not a MovieLens ratings header: "
                       r"expected the columns userId, movieId, rating, timestamp"):
        read_events(path, "movielens")
