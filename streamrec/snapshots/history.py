"""The serving history's rollback stack, and compacting the history to the lines its readers need.

``serving/history.jsonl`` gains a line at every promotion (one every 3 minutes where a gate
promotes each snapshot: 175,000 lines, 26 MB, a year), and it is read whole at every prune and
rollback. Its readers (`streamrec.snapshots.pointer.ServingPointer`) ask four things of it: the
rollback stack (`replay`), the versions served in order of first service (``promoted``) and of
last service (``recently_served``), and its last line. About a version no longer on disk they
need nothing: it is never promoted, rolled back to or listed again.

`compacted` picks the lines to keep so that each of those answers, about every version kept,
is what the whole history gives, now and after any later promotion or rollback: the lines that
pushed the stack's kept entries, each kept version's first and last lines, the last lines of
the file, and every line those depend on (the rollback that popped a kept push, the entry a
rollback or a repeated promotion acted on). It checks the answers before it returns: where
they would differ, it keeps the whole history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

# Events that move CURRENT; the others ("canary", "ab", "end") start or end a traffic plan and
# leave it where it was (their version is the one served throughout).
POINTER_ACTIONS = ("promote", "rollback")


class Event(Protocol):
    """What the stack reads of a history line (`streamrec.snapshots.pointer.ServingEvent`)."""

    @property
    def action(self) -> str:
        """``promote``, ``rollback``, ``canary``, ``ab`` or ``end``."""

    @property
    def version(self) -> int:
        """The version served from then on."""


@dataclass
class Replay:
    """The rollback stack a history builds, and which line each step of it rested on.

    A promote pushes its version (unless it is on top already); a rollback pops back to the
    first entry of its version, or pushes it when the stack holds none.
    """

    entries: list[tuple[int, int]] = field(default_factory=list)  # (version, the line that pushed it)
    rests_on: dict[int, int] = field(default_factory=dict)  # line -> the pushing line of the entry it used
    popped_by: dict[int, int] = field(default_factory=dict)  # pushing line -> the rollback that popped it

    @property
    def versions(self) -> list[int]:
        """The stack, bottom first."""
        return [version for version, _ in self.entries]


def replay(events: Sequence[Event]) -> Replay:
    """The rollback stack of ``events``, oldest first."""
    state = Replay()
    stack = state.entries
    lowest: dict[int, int] = {}  # version -> where its first entry is: a rollback's search, O(1)
    for line, event in enumerate(events):
        if event.action not in POINTER_ACTIONS:
            continue
        if event.action == "rollback":
            found = lowest.get(event.version)
            if found is not None:
                state.rests_on[line] = stack[found][1]
                for at in range(found + 1, len(stack)):  # each entry popped once: O(lines) in all
                    version, pusher = stack[at]
                    state.popped_by[pusher] = line
                    if lowest.get(version) == at:
                        del lowest[version]
                del stack[found + 1:]
                continue
        elif stack and stack[-1][0] == event.version:
            state.rests_on[line] = stack[-1][1]  # on top already: nothing pushed
            continue
        lowest.setdefault(event.version, len(stack))
        stack.append((event.version, line))
    return state


def compacted(events: Sequence[Event], keep: set[int], tail: int) -> list[int] | None:
    """The lines of ``events`` to keep, in order, answering as all do about the versions ``keep``.

    ``keep`` holds every version still on disk, the served one among them; the last ``tail``
    lines are kept whatever they name. None: nothing to drop, or the lines picked would answer
    otherwise (the whole history is kept).
    """
    state = replay(events)
    needed = {pusher for version, pusher in state.entries if version in keep}
    needed |= _ends(events, keep) | set(range(max(0, len(events) - tail), len(events)))
    work = list(needed)
    while work:  # what each kept line rested on, and the rollback that undid its push
        line = work.pop()
        for other in (state.rests_on.get(line), state.popped_by.get(line)):
            if other is not None and other not in needed:
                needed.add(other)
                work.append(other)
    if len(needed) == len(events):
        return None
    lines = sorted(needed)
    if _answers([events[n] for n in lines], keep) != _answers(events, keep, state):
        return None
    return lines


def _ends(events: Sequence[Event], keep: set[int]) -> set[int]:
    """The first and the last line of each version in ``keep``."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for line, event in enumerate(events):
        if event.version in keep:
            first.setdefault(event.version, line)
            last[event.version] = line
    return set(first.values()) | set(last.values())


def _answers(
    events: Sequence[Event], keep: set[int], state: Replay | None = None
) -> tuple[list[int], list[int], list[int]]:
    """The stack (repeats side by side counted once), and the first- and last-served orders, of ``keep``.

    ``state``: `replay` of ``events``, when made already.
    """
    stack: list[int] = []
    for version in (replay(events) if state is None else state).versions:
        if version in keep and (not stack or stack[-1] != version):
            stack.append(version)
    first = [v for v in dict.fromkeys(e.version for e in events) if v in keep]
    last = [v for v in dict.fromkeys(e.version for e in reversed(events)) if v in keep]
    return stack, first, last
