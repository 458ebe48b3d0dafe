"""Snapshot requests: ``streamrec snapshot create`` asks the running learner for a snapshot.

A request is an empty file ``<root>/.requests/<id>``, created under a dot-name and renamed into
place so the learner never sees half of one. The learner answers it by writing a version whose
manifest carries the request's id, or, when nothing was trained since the newest version, with
a ``.<id>.answer`` file naming that version.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from streamrec.snapshots.directory import parse_version, version_name

REQUESTS = ".requests"


class SnapshotRequests:
    """``<root>/.requests/``: requests filed by the CLI and answered by the learner."""

    def __init__(self, root: Path) -> None:
        """The requests of the snapshot directory ``root`` (nothing is created until one is filed)."""
        self.dir = Path(root) / REQUESTS

    def request(self) -> str:
        """File a request for a snapshot; returns its id."""
        request_id = uuid.uuid4().hex
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{request_id}.tmp"
        tmp.write_bytes(b"")
        os.rename(tmp, self.dir / request_id)
        return request_id

    def pending(self) -> list[str]:
        """Ids of requests no snapshot has answered yet."""
        if not self.dir.is_dir():
            return []
        return sorted(p.name for p in self.dir.iterdir() if not p.name.startswith("."))

    def done(self, request_id: str) -> None:
        """Remove an answered request."""
        (self.dir / request_id).unlink(missing_ok=True)

    def answer(self, request_id: str, version: int) -> None:
        """Answer a request with an existing version (nothing trained since it was written)."""
        tmp = self.dir / f".{request_id}.answer.tmp"
        tmp.write_text(f"{version_name(version)}\n")
        os.rename(tmp, self.dir / f".{request_id}.answer")

    def answered(self, request_id: str) -> int | None:
        """The existing version `answer` gave a request, if any (its answer is consumed)."""
        path = self.dir / f".{request_id}.answer"
        try:
            version = parse_version(path.read_text())
        except OSError:
            return None
        path.unlink(missing_ok=True)
        return version
