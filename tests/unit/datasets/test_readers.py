"""Dataset readers on the bundled MovieLens, files written here, and the real Taobao file
in ../shared/data when present (extra coverage only).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from streamrec.datasets import detect_format, read_events
from streamrec.errors import DatasetError


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
