"""How the ``streamrec snapshot`` commands show a version: its table row, its figures, its export's
check as a word, a line or a document, and a diff (`streamrec.cli.snapshot`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from rich.markup import escape
from rich.table import Table

from streamrec.cli.common import console
from streamrec.cli.snapshot_common import version_name

if TYPE_CHECKING:  # numpy, pydantic: imported when a command runs, not for --help
    from streamrec.snapshots.diff import SnapshotDiff
    from streamrec.snapshots.exports import ExportCheck
    from streamrec.snapshots.store import SnapshotEntry, SnapshotManifest


def manifest_doc(manifest: SnapshotManifest) -> dict[str, Any]:
    """A manifest as a JSON document (``--json``)."""
    doc: dict[str, Any] = orjson.loads(manifest.to_json())
    return doc


def format_positions(manifest: SnapshotManifest) -> str:
    """``partition:offset`` pairs of the positions a snapshot was trained up to."""
    return " ".join(f"{p.partition}:{p.offset}" for p in manifest.positions)


def fmt(value: object) -> str:
    """A figure for a table: ``-`` for none, four decimals for a float."""
    return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def serving_mark(version: int, current: int | None, promoted: set[int]) -> str:
    """``CURRENT``, ``promoted`` (once served) or nothing."""
    return "CURRENT" if version == current else "promoted" if version in promoted else ""


def format_kind(manifest: SnapshotManifest) -> str:
    """``full``, or ``delta of v000006`` for a delta snapshot."""
    return "full" if manifest.parent is None else f"{manifest.kind} of {version_name(manifest.parent)}"


def table_row(entry: SnapshotEntry, root: Path, serving: str) -> list[str]:
    """A table row: the manifest's figures when it is readable, and whether the version is
    valid (paths in the reason shown relative to ``root``).
    """
    problem = entry.problem and entry.problem.replace(f"{root}{os.sep}", "")
    status = "ok" if problem is None else f"[red]invalid[/red]: {escape(problem)}"
    serving = f"[bold green]{serving}[/bold green]" if serving == "CURRENT" else serving
    m = entry.manifest
    if m is None:
        return [entry.name, serving, "-", "-", "-", "-", "-", "-", "-", status]
    return [
        m.name, serving, format_kind(m), m.created_at[:19].replace("T", " "), str(m.micro_batches),
        str(m.samples_trained),
        fmt(m.metrics.get("auc")), fmt(m.metrics.get("gauc")), format_positions(m), status,
    ]


def export_doc(check: ExportCheck) -> dict[str, Any]:
    """An export's check as a JSON document (``--json``)."""
    return {"path": str(check.path), "present": not check.missing, "valid": check.whole,
            "problem": check.problem, "own": check.own}


def export_word(check: ExportCheck) -> str:
    """A word for a table cell: ok, missing, damaged or not servable (`snapshot verify` says why)."""
    if check.missing:
        return "missing"
    if check.own:
        return "[yellow]not servable[/yellow]"
    return "ok" if check.problem is None else "[red]damaged[/red]"


def export_text(check: ExportCheck) -> str:
    """An export's check as `snapshot verify` says it, with why it is not ok."""
    if check.missing:
        return f"missing (`streamrec snapshot export {check.version}` builds it)"
    if check.own:
        return f"[yellow]not servable[/yellow]: {escape(check.problem or '')}"
    return "ok" if check.problem is None else f"[red]invalid[/red]: {escape(check.problem)}"


def print_diff(d: SnapshotDiff) -> None:
    """`snapshot diff` as text: changed fields, metrics, positions and settings, then the tensors."""
    console.print(f"{version_name(d.a)} -> {version_name(d.b)}", highlight=False)
    for title, changes in (("fields", d.fields), ("metrics", d.metrics), ("positions", d.positions),
                           ("config", d.config)):
        if changes:
            console.print(f"{title}:", highlight=False)
        for c in changes:
            console.print(f"  {escape(c.key)}: {escape(fmt(c.a))} -> {escape(fmt(c.b))}", highlight=False)
    table = Table("file", "tensor", "status", "shape", "changed rows", "max |diff|")
    for t in d.changed_tensors:
        shape = str(t.shape_b if t.shape_b is not None else t.shape_a)
        if t.status in ("reshaped", "grown"):
            shape = f"{t.shape_a} -> {t.shape_b}"
        rows = "-" if t.changed_rows is None else f"{t.changed_rows}/{t.rows}"
        if t.added_rows is not None:
            rows += f", {t.added_rows} added"
        gap = "-" if t.max_abs_diff is None else f"{t.max_abs_diff:.4g}"
        table.add_row(t.file, t.name, t.status, shape, rows, gap)
    same = len(d.tensors) - len(d.changed_tensors)
    if table.row_count:
        console.print(table)
    console.print(f"{len(d.changed_tensors)} tensors differ, {same} the same", highlight=False)
