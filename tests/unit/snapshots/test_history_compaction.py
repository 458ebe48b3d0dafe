"""The serving history is compacted at prune, and every reader's answer stays as it was.

Found by the snapshot tools tour (helper A): ``serving/history.jsonl`` grew by a line at each
promotion (26 MB a year at one every 3 minutes) and was read whole at every prune (after each
snapshot) and rollback. Now prune compacts it under the pointer's lock, written atomically,
keeping the lines `rollback_candidates`, `retained`, `promoted`, `recently_served` and the
listings' served marks need: their answers about every version still on disk are unchanged,
over long random histories of promotions, rollbacks, canaries and prunes, and after more
events follow a compaction.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import orjson
import pytest

from streamrec.snapshots import pointer as pointer_module
from streamrec.snapshots.history import compacted
from streamrec.snapshots.pointer import ServingEvent, ServingPointer
from streamrec.snapshots.store import SnapshotStore


def _answers(ptr: ServingPointer, on_disk: set[int]) -> dict[str, object]:
    """What every reader of the history answers, about the versions on disk."""
    current = ptr.current()

    def kept(versions: list[int]) -> list[int]:
        return [v for v in versions if v in on_disk]

    return {
        "candidates": kept(ptr.rollback_candidates(current)),
        "candidates_none": kept(ptr.rollback_candidates(None)),
        "recently_served": kept(ptr.recently_served()),
        "promoted": kept(ptr.promoted()),
        "retained": {n: ptr.retained(n) & on_disk for n in (1, 2, 3, 5)},
    }


class History:
    """A random serving history, kept whole in one directory and compacted in another."""

    def __init__(self, tmp_path: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.whole = ServingPointer(tmp_path / "whole")
        self.small = ServingPointer(tmp_path / "small")
        for ptr in (self.whole, self.small):
            ptr.dir.mkdir(parents=True)
        self.newest, self.on_disk = 0, set[int]()
        self.current: int | None = None
        self.time = 0

    def _event(self, action: str, version: int, traffic: str | None = None) -> None:
        self.time += 1
        doc = {"time": str(self.time), "action": action, "version": version, "previous": self.current,
               "reason": "test"} | ({"traffic": traffic} if traffic else {})
        line = orjson.dumps(doc) + b"\n"
        for ptr in (self.whole, self.small):
            with ptr.history_path.open("ab") as fh:
                fh.write(line)
            if action in ("promote", "rollback"):
                ptr.current_path.write_text(f"v{version:06d}\n")
        if action in ("promote", "rollback"):
            self.current = version

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.45 or self.current is None:  # a new snapshot, promoted
            self.newest += 1
            self.on_disk.add(self.newest)
            self._event("promote", self.newest)
        elif roll < 0.6:  # an older version on disk promoted again
            self._event("promote", rng.choice(sorted(self.on_disk)))
        elif roll < 0.8:  # a rollback, to the first candidate on disk
            candidates = [v for v in self.whole.rollback_candidates(self.current) if v in self.on_disk]
            if candidates:
                self._event("rollback", candidates[0])
        elif roll < 0.9:  # a canary started and ended
            self._event("canary", self.current, "canary")
            self._event("end", self.current, "canary")
        else:  # retention: what prune keeps of the whole history, then the compaction
            keep = self.whole.retained(2) | set(sorted(self.on_disk)[-3:])
            self.on_disk &= keep
            self.compact()

    def compact(self) -> None:
        before = _answers(self.whole, self.on_disk)
        assert before == _answers(self.small, self.on_disk)
        self.small.compact(set(self.on_disk))
        assert _answers(self.small, self.on_disk) == before
        last = self.whole.history()[-1]
        assert self.small.history()[-1] == last  # `tail -1` and the commands' own last line


@pytest.mark.parametrize("seed", range(8))
def test_answers_are_unchanged_over_long_random_histories(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pointer_module, "COMPACT_LINES", 50)
    history = History(tmp_path, seed)
    for _ in range(500):
        history.step()
    history.compact()
    whole, small = (len(p.history_path.read_bytes().splitlines()) for p in (history.whole, history.small))
    assert small < whole / 4, (small, whole)


def test_a_gate_promoting_every_snapshot_keeps_a_bounded_history(tmp_path: Path) -> None:
    """175,000 promotions (a year at one every 3 minutes), 10 versions on disk: a few dozen lines."""
    events = [ServingEvent(str(n), "promote", n, n - 1 or None, "gate") for n in range(1, 175_001)]
    lines = compacted(events, set(range(174_991, 175_001)), tail=20)
    assert lines is not None and len(lines) <= 30
    assert lines[-20:] == list(range(174_980, 175_000))


def test_a_short_history_is_left_as_it_is(tmp_path: Path) -> None:
    ptr = ServingPointer(tmp_path)
    ptr.dir.mkdir()
    with ptr.locked():
        for version in (1, 2, 3):
            ptr.record("promote", version, version - 1 or None, "test")
    raw = ptr.history_path.read_bytes()
    assert ptr.compact({3}) == 0 and ptr.history_path.read_bytes() == raw


def _promoting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int, keep: int) -> SnapshotStore:
    """A store where ``count`` snapshots were each promoted (and pruned to ``keep``; 0: never)."""
    from tests.unit.snapshots.test_snapshot import write

    monkeypatch.setattr(pointer_module, "COMPACT_LINES", 25)
    store = SnapshotStore(tmp_path)
    for _ in range(count):
        store.promote(write(store).version)
        store.prune(keep)
        assert len(store.history()) <= 25 + 1  # compacted to its last 20 lines and the pushers
    return store


def test_prune_compacts_the_history_and_rollbacks_go_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `test_promotion.test_retention_is_bounded_when_every_snapshot_is_promoted`, compacted."""
    store = _promoting(tmp_path, monkeypatch, 40, keep=3)
    assert store.versions() == [37, 38, 39, 40]
    assert [e.version for e in store.history()][-4:] == [37, 38, 39, 40]
    assert store.promoted()[-4:] == [37, 38, 39, 40]
    assert (store.rollback(), store.rollback(), store.rollback()) == (39, 38, 37)
    assert store.prune(3) == []
    assert store.versions() == [37, 38, 39, 40]


def test_a_prune_reads_the_history_and_replays_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the last stop's review: a prune read the history three times (rollback order and
    recent service for retention, then compaction), and a compaction replayed it three times.
    """
    from streamrec.snapshots import history as history_module
    from streamrec.snapshots.history import Replay

    store = _promoting(tmp_path, monkeypatch, 25, keep=0)
    store.promote(store.write({"model": {"w": np.ones(3, np.float32)}}, micro_batches=1,
                              samples_trained=1, positions=()).version)
    reads: list[int] = []
    replays: list[int] = []
    real_parse, real_replay = ServingPointer._parse, history_module.replay

    def parse(self: ServingPointer, lines: list[bytes]) -> list[ServingEvent | None]:
        reads.append(len(lines))
        return real_parse(self, lines)

    def replay(events: list[ServingEvent]) -> Replay:
        replays.append(len(events))
        return real_replay(events)

    monkeypatch.setattr(ServingPointer, "_parse", parse)
    for module in (history_module, pointer_module):
        monkeypatch.setattr(module, "replay", replay)
    assert store.prune(3) == list(range(1, 23))
    assert reads == [26], reads  # the whole history, once
    assert replays[:2] == [26, 26] and len(replays) == 3, replays  # retention, compaction, its check
    assert replays[2] == len(store.history()) < 26  # the lines kept, replayed to check them


def test_the_lines_a_compaction_drops_are_archived_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the tour's merge: compaction dropped the lines about deleted versions, the audit of
    who promoted what and why. They are appended to ``history-archive.jsonl``, never read back.
    """
    store = _promoting(tmp_path, monkeypatch, 40, keep=3)
    archived = store.serving.archive_path.read_bytes().splitlines()
    kept = store.serving.history_path.read_bytes().splitlines()
    assert sorted(archived + kept) == sorted(set(archived + kept))  # no line twice
    versions = [orjson.loads(line)["version"] for line in archived + kept]
    assert sorted(versions) == list(range(1, 41)), versions  # each promotion's line, once
    times = [orjson.loads(line)["time"] for line in archived]
    assert times == sorted(times)


def test_a_compaction_that_cannot_write_leaves_the_history_and_the_prune_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _promoting(tmp_path, monkeypatch, 25, keep=0)
    store.promote(store.write({"model": {"w": np.ones(3, np.float32)}}, micro_batches=1,
                              samples_trained=1, positions=()).version)
    raw = store.serving.history_path.read_bytes()

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    assert not store.serving.archive_path.exists()  # never pruned: nothing archived
    monkeypatch.setattr(pointer_module, "write_atomic", full)
    assert store.prune(3) == list(range(1, 23))
    assert store.serving.history_path.read_bytes() == raw
    assert store.serving.archive_path.read_bytes() == b""  # its lines not archived twice later


def test_the_stack_in_one_pass_is_the_stack_searched_line_by_line() -> None:
    """`replay` keeps where each version's first entry is; before, a rollback searched the stack."""
    from streamrec.snapshots.history import replay

    def searched(events: list[ServingEvent]) -> list[int]:
        stack: list[int] = []
        for e in events:
            if e.action == "rollback" and e.version in stack:
                del stack[stack.index(e.version) + 1:]
            elif e.action in ("promote", "rollback") and (not stack or stack[-1] != e.version):
                stack.append(e.version)
        return stack

    rng = random.Random(0)
    for _ in range(2000):
        top = rng.choice([3, 6, 20])
        events = [ServingEvent("t", rng.choice(["promote", "promote", "rollback", "canary"]),
                               rng.randint(1, top), None, "test") for _ in range(rng.randint(0, 80))]
        assert replay(events).versions == searched(events)
