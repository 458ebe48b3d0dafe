"""``streamrec snapshot create|list``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from streamrec.cli.common import build_config, cli_errors, console
from streamrec.errors import SnapshotError
from streamrec.learner.snapshot import SnapshotEntry, SnapshotManifest, SnapshotStore

app = typer.Typer(help="Create and list versioned model snapshots.", no_args_is_help=True)


def _store(snapshot_dir: Path | None) -> SnapshotStore:
    return SnapshotStore(build_config(learner={"snapshot_dir": snapshot_dir}).learner.snapshot_dir)


@app.command("create")
def create(
    snapshot_dir: Path | None = typer.Option(None, help="The learner's snapshot directory"),
    timeout: float = typer.Option(60.0, help="Seconds to wait for the running learner"),
) -> None:
    """Ask the running learner for a snapshot now and wait until it is written."""
    with cli_errors():
        store = _store(snapshot_dir)
        request_id = store.request()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            manifest = store.find_request(request_id)
            if manifest is not None:
                console.print(f"snapshot {manifest.name} written: {store.path(manifest.version)}")
                return
            time.sleep(0.2)
        store.done(request_id)
        raise SnapshotError(
            f"no learner answered within {timeout:.0f}s: is `streamrec learner run` running "
            f"with snapshot dir {store.root}?"
        )


def format_positions(manifest: SnapshotManifest) -> str:
    """``partition:offset`` pairs of the positions a snapshot was trained up to."""
    return " ".join(f"{p.partition}:{p.offset}" for p in manifest.positions)


def _fmt(value: object) -> str:
    return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def _row(entry: SnapshotEntry, root: Path) -> list[str]:
    """A table row: the manifest's figures when it is readable, and whether the version is
    valid (paths in the reason shown relative to ``root``)."""
    problem = entry.problem and entry.problem.replace(f"{root}{os.sep}", "")
    status = "ok" if problem is None else f"[red]invalid[/red]: {escape(problem)}"
    m = entry.manifest
    if m is None:
        return [entry.name, "-", "-", "-", "-", "-", "-", status]
    return [
        m.name, m.created_at[:19].replace("T", " "), str(m.micro_batches), str(m.samples_trained),
        _fmt(m.metrics.get("auc")), _fmt(m.metrics.get("gauc")), format_positions(m), status,
    ]


@app.command("list")
def list_(snapshot_dir: Path | None = typer.Option(None, help="The snapshot directory")) -> None:
    """List snapshots, oldest first, verifying every checksum; invalid ones say why.

    A learner resumes from the newest valid one. Listing needs no lock, so it works while a
    learner runs.
    """
    with cli_errors():
        store = _store(snapshot_dir)
        table = Table(
            "version", "created (UTC)", "micro-batches", "samples", "AUC", "GAUC", "positions", "status"
        )
        for entry in store.entries():
            table.add_row(*_row(entry, store.root))
        if table.row_count == 0:
            console.print(f"no snapshots in {store.root}")
        else:
            console.print(table)
