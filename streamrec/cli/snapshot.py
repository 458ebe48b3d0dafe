"""``streamrec snapshot create|list|show|verify|diff|promote|rollback|prune|export|materialize``
(``canary`` and ``ab``: `streamrec.cli.traffic`).

Human-readable by default; ``--json`` prints one JSON document on stdout instead (errors still
go to stderr as one line, exit status 1). A VERSION is ``v000007``, ``7``, ``current`` (the
promoted one) or ``latest`` (the newest valid one).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

from streamrec.cli.common import build_config, cli_errors, command_group, console, err_console, print_json
from streamrec.cli.options import ConfigFile, LogLevel, path_given, setting
from streamrec.cli.snapshot_common import (
    DirOption,
    JsonOption,
    arm_docs,
    arms_of,
    build_export,
    current_plan,
    open_store,
    plan_doc,
    serve_check,
    served,
    version_name,
    version_problem,
)
from streamrec.cli.snapshot_format import (
    export_doc,
    export_text,
    export_word,
    fmt,
    format_kind,
    manifest_doc,
    print_diff,
    serving_mark,
    table_row,
)
from streamrec.errors import InvalidSnapshot, SnapshotError

if TYPE_CHECKING:  # numpy, the Kafka client, pydantic: imported when a command runs, not for --help
    from streamrec.snapshots.exports import ExportCheck

app = command_group("Create, inspect, verify, promote, roll back, prune and split traffic between snapshots.")

VersionArg = typer.Argument(..., help="v000007, 7, current or latest")
OwnServerOption = typer.Option(  # promote and verify: one flag, one help
    False, "--own-server",
    help="For a server of your own that follows serving/CURRENT: take an export `streamrec serve` "
    "does not load (a learner's own contract.json), checking its checksums only",
)


@app.command("create")
def create(
    snapshot_dir: Path | None = DirOption,
    timeout: float = typer.Option(60.0, help="Seconds to wait for the running learner"),
    as_json: bool = JsonOption,
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Ask the running learner for a snapshot now and wait until it is written; with nothing
    trained since its newest version, that version answers (no empty version is written).
    """
    from streamrec.snapshots.lock import SnapshotLock

    with cli_errors():
        store = open_store(snapshot_dir, log_level, config_file)
        request_id = store.requests.request()
        if not SnapshotLock(store.root).holder():  # read, not taken: a learner starting now must get it
            err_console.print(
                f"no learner holds {store.root} now: waiting {timeout:g} s for one to start and answer",
                highlight=False,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            existing = store.requests.answered(request_id)
            if existing is not None:
                if as_json:
                    print_json({"version": existing, "path": str(store.path(existing)), "new": False})
                else:
                    console.print(f"nothing trained since {version_name(existing)}: no new snapshot; "
                                  f"it is the newest: {store.path(existing)}", highlight=False)
                return
            manifest = store.find_request(request_id)
            if manifest is not None:
                if as_json:
                    path = str(store.path(manifest.version))
                    print_json({"version": manifest.version, "path": path, "new": True})
                else:
                    console.print(f"snapshot {manifest.name} written: {store.path(manifest.version)}")
                return
            time.sleep(0.2)
        store.requests.done(request_id)
        raise SnapshotError(
            f"no learner answered within {timeout:.0f}s: is `streamrec learner run` running "
            f"with snapshot dir {store.root}?"
        )


@app.command("list")
def list_(
    snapshot_dir: Path | None = DirOption,
    as_json: bool = JsonOption,
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """List snapshots, oldest first, verifying checksums and finite state; invalid ones say why.

    The served version is marked CURRENT, earlier promoted ones "promoted"; the export column
    says whether serving's export is ok, missing, damaged (checksums, or what `streamrec serve`
    reads of it) or "not servable" (a learner's own); `snapshot verify` says why.

    A learner resumes from the newest valid one. Listing needs no lock, so it works while a
    learner runs; an unreadable serving/CURRENT is a warning (promoting a version replaces it).
    """
    with cli_errors():
        store = open_store(snapshot_dir, log_level, config_file)
        from streamrec.serving.loading import check_loads

        entries = [replace(e, problem=version_problem(store, e.version, e.problem)) for e in store.entries()]
        current, pointer_problem = served(store)
        promoted, plan = set(store.promoted()), current_plan(store)
        exports = {e.version: check_loads(store.root, e.version) for e in entries}
        if as_json:
            print_json({"root": str(store.root), "current": current, "pointer_problem": pointer_problem,
                        "traffic": plan_doc(plan), "versions": [
                {
                    "version": e.version, "name": e.name, "valid": e.problem is None, "problem": e.problem,
                    "current": e.version == current, "promoted": e.version in promoted,
                    "arms": arm_docs(plan, e.version, current),
                    "manifest": e.manifest and manifest_doc(e.manifest),
                    "export": export_doc(exports[e.version]),
                }
                for e in entries
            ]})
            return
        table = Table(
            "version", "serving", "kind", "created (UTC)", "micro-batches", "samples", "AUC", "GAUC",
            "positions", "status", "export",
        )
        for entry in entries:
            mark = ", ".join(filter(None, (serving_mark(entry.version, current, promoted),
                                           arms_of(plan, entry.version, current))))
            row = table_row(entry, store.root, mark)
            table.add_row(*row, export_word(exports[entry.version]))
        if table.row_count == 0:
            console.print(f"no snapshots in {store.root}")
        else:
            console.print(table)
        if plan is not None:
            console.print(f"traffic: {plan.describe()} (since {plan.started[:19]})", highlight=False)


@app.command("show")
def show(
    version: str = VersionArg,
    snapshot_dir: Path | None = DirOption,
    as_json: bool = JsonOption,
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Print a version's manifest (positions, metrics, config, file checksums) and its status;
    exit status 1 when it is invalid (as `verify`), after printing it.
    """
    with cli_errors():
        store = open_store(snapshot_dir, log_level, config_file)
        number = store.resolve(version)
        manifest = store.manifest(number)
        problem = version_problem(store, number, store.validate(number))

        current, _ = served(store)
        promoted, plan = set(store.promoted()), current_plan(store)
        arms = arms_of(plan, number, current)
        if as_json:
            print_json(manifest_doc(manifest) | {
                "name": manifest.name, "valid": problem is None, "problem": problem,
                "current": number == current, "promoted": number in promoted,
                "arms": arm_docs(plan, number, current), "traffic": plan_doc(plan),
            })
            raise typer.Exit(0 if problem is None else 1)
        lines = [
            ("version", f"{manifest.name} {serving_mark(number, current, promoted)}".rstrip()),
            ("traffic", f"{arms} of {plan.describe()}" if plan is not None and arms else "-"),
            ("status", "ok" if problem is None else f"invalid: {problem}"),
            ("path", str(store.path(number))),
            ("kind", format_kind(manifest)),
            ("created", manifest.created_at),
            ("micro-batches", str(manifest.micro_batches)),
            ("samples", str(manifest.samples_trained)),
            ("positions", " ".join(f"{p.topic}[{p.partition}]:{p.offset}" for p in manifest.positions)),
            ("request", manifest.request_id or "-"),
        ]
        lines += [(f"metrics.{k}", fmt(v)) for k, v in sorted(manifest.metrics.items())]
        from streamrec.snapshots.diff import flatten

        lines += [(f"config.{k}", str(v)) for k, v in sorted(flatten(manifest.config).items())]
        lines += [(f"files.{name}", digest) for name, digest in sorted(manifest.files.items())]
        width = max(len(k) for k, _ in lines)
        for key, value in lines:
            console.print(f"{key:<{width}}  {escape(value)}", highlight=False)
    if problem is not None:
        raise typer.Exit(1)


@app.command("verify")
def verify(
    version: str | None = typer.Argument(None, help="One version", show_default="every version"),
    own_server: bool = OwnServerOption,
    snapshot_dir: Path | None = DirOption,
    as_json: bool = JsonOption,
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Verify every checksum of one version or of all, that its state is finite, and that
    `streamrec serve` would load its export (each graph run on a probe batch); exit status 1 if
    any is invalid, or if the directory does not exist. A version without an export says so
    (serving builds it when promoted).
    """
    from streamrec.snapshots.exports import check_export

    check = check_export if own_server else _check_graphs
    with cli_errors():
        store = open_store(snapshot_dir, log_level, config_file)  # a mistyped directory: refused
        versions = [store.resolve(version)] if version is not None else store.versions()
        results: list[tuple[int, str | None, ExportCheck]] = []
        for number in versions:
            try:
                store.verify(number)
                problem = version_problem(store, number, None)  # NaN state: resume and export refuse it
            except SnapshotError as exc:
                problem = str(exc)
            results.append((number, problem, check(store.root, number)))
        bad = sum(problem is not None or export.problem is not None for _, problem, export in results)
        if as_json:
            print_json({"root": str(store.root), "valid": bad == 0, "versions": [
                {"version": n, "name": version_name(n), "valid": p is None and e.problem is None,
                 "problem": p, "export": export_doc(e)}
                for n, p, e in results
            ]})
        elif not results:
            console.print(f"no snapshots in {store.root}")
        else:
            for number, problem, export in results:
                status = "ok" if problem is None else f"[red]invalid[/red]: {escape(problem)}"
                line = f"{version_name(number)}  {status}; export {export_text(export)}"
                console.print(line, highlight=False)
            console.print(f"{len(results) - bad} valid, {bad} invalid", highlight=False)
    if bad:
        raise typer.Exit(1)


def _check_graphs(root: Path, version: int) -> ExportCheck:
    """An export checked as serve loads it: read (`check_loads`), then each graph run on a probe."""
    from streamrec.serving.loading import read_checked

    check, contents = read_checked(root, version)
    if contents is None:
        return check
    from streamrec.serving.probe import graphs_problem  # Paddle: only where there is a graph to run

    problem = graphs_problem(contents)
    return check if problem is None else replace(check, problem=problem)


@app.command("diff")
def diff(
    a: str = typer.Argument(..., help="The older version (v000007, 7, current or latest)"),
    b: str = typer.Argument(..., help="The newer version"),
    snapshot_dir: Path | None = DirOption,
    as_json: bool = JsonOption,
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Differences between two versions: metrics, positions, config and, per tensor file, which
    tensors changed (rows changed, largest absolute difference).
    """
    from streamrec.snapshots.diff import diff_snapshots

    with cli_errors():
        store = open_store(snapshot_dir, log_level, config_file)
        result = diff_snapshots(store, store.resolve(a), store.resolve(b))
        if as_json:
            print_json(result)
        else:
            print_diff(result)


@app.command("promote")
def promote(
    version: str = VersionArg,
    reason: str = typer.Option("manual", help="Why, for the serving history"),
    own_server: bool = OwnServerOption,
    snapshot_dir: Path | None = DirOption,
    as_json: bool = JsonOption,
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Verify a version's checksums, its state and its export, then point serving at it (serving/CURRENT).

    A damaged export is refused, naming the file (`snapshot export VERSION --rebuild` mends
    it); a missing one is built first. An export `streamrec serve` would not load (a learner
    of your own, exporting its own contract) is refused unless --own-server. The version
    already served: nothing changes, and nothing is added to the history.
    """
    with cli_errors():
        store = open_store(snapshot_dir, log_level, config_file)
        number = store.resolve(version)
        before = store.history()[-1:]  # its last line: a prune meanwhile may compact the rest
        check = None if own_server else serve_check(store)  # a server of one's own: its own check
        manifest = store.promote(number, reason=reason, build_export=build_export(store), serve_check=check)
        history = store.history()
        if history[-1:] == before:  # nothing recorded: it was served already
            if as_json:
                print_json({"current": manifest.version, "name": manifest.name, "previous": manifest.version,
                             "ended": None, "changed": False})
            else:
                console.print(f"{manifest.name} is served already: nothing changed", highlight=False)
            return
        previous = next(e.previous for e in reversed(history) if e.action == "promote")
        ended = history[-1].traffic if history[-1].action == "end" else None
        if as_json:
            print_json({"current": manifest.version, "name": manifest.name, "previous": previous,
                         "ended": ended, "changed": True})
        else:
            was = f" (was {version_name(previous)})" if previous is not None else ""
            console.print(f"serving {manifest.name}{was}: {store.serving.current_path}", highlight=False)
            if ended:
                console.print(f"ended: {ended}", highlight=False)


@app.command("rollback")
def rollback(
    reason: str = typer.Option("manual", help="Why, for the serving history"),
    snapshot_dir: Path | None = DirOption,
    as_json: bool = JsonOption,
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Point serving back at the valid version promoted before the current one (skipping any
    whose export is damaged or `streamrec serve` would not load; a missing export is built first).
    """
    with cli_errors():
        store = open_store(snapshot_dir, log_level, config_file)
        build, check = build_export(store), serve_check(store)
        version = store.rollback(reason=reason, build_export=build, serve_check=check)
        last = store.history()[-1]
        previous, ended = last.previous, last.traffic if last.action == "end" else None
        if as_json:
            print_json({"current": version, "name": version_name(version), "previous": previous,
                         "ended": ended})
        elif ended:
            console.print(f"ended {ended}: serving {version_name(version)} to every user", highlight=False)
        else:
            was = f" (was {version_name(previous)})" if previous is not None else ""
            console.print(f"rolled back: serving {version_name(version)}{was}", highlight=False)


@app.command("prune")
def prune(
    keep: int | None = setting("learner.keep_snapshots"),
    snapshot_dir: Path | None = DirOption,
    as_json: bool = JsonOption,
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Delete all but the newest versions; the served one, those just before it and the newest valid stay."""
    from streamrec.snapshots.store import SnapshotStore

    with cli_errors():
        cfg = build_config(
            quiet=True,
            log_level=log_level,
            config_file=config_file,
            learner={"snapshot_dir": snapshot_dir, "keep_snapshots": keep},
        )
        store = SnapshotStore(cfg.learner.snapshot_dir)
        keep_last = cfg.learner.keep_snapshots
        # A version kept for a chain alone loses its export: said too, as it frees room.
        deleted, exports_gone = store.pruned(keep_last)
        if as_json:
            print_json({"keep": keep_last, "deleted": deleted, "exports_deleted": exports_gone,
                        "kept": store.versions()})
        elif deleted or exports_gone:
            said = [f"deleted {', '.join(map(version_name, deleted))}"] if deleted else []
            if exports_gone:
                names = ", ".join(map(version_name, exports_gone))
                said.append(f"deleted the exports of {names} (their snapshots kept: a kept delta needs them)")
            console.print(f"{'; '.join(said)}; {len(store.versions())} kept", highlight=False)
        else:
            console.print(f"nothing to delete (keeping {keep_last or 'all'})", highlight=False)


@app.command("export")
def export(
    version: str = VersionArg,
    rebuild: bool = typer.Option(
        False, "--rebuild", help="Rebuild an export that fails its checksums or that serve would not load"
    ),
    snapshot_dir: Path | None = DirOption,
    as_json: bool = JsonOption,
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Export a version for Paddle Inference (model, id tables, contract.json) under
    ``<snapshot dir>/exports/``; the learner exports every snapshot it writes. A version that
    fails its checks (as `verify` says) is refused, its export whole or not.
    """
    import orjson

    from streamrec.serving.export import export_snapshot
    from streamrec.snapshots.exports import MANIFEST, refuse_unservable

    with cli_errors():
        store = open_store(snapshot_dir, log_level, config_file)
        number = store.resolve(version)
        try:  # a damaged version is refused as `verify` and `promote` refuse it, its export whole or not
            path = export_snapshot(store, number, rebuild=rebuild, strict=True)
        except InvalidSnapshot as exc:
            raise InvalidSnapshot(f"{version_name(number)} is not exported: {exc}") from exc
        check = _check_graphs(store.root, number)  # checksums, then as serve loads it and its graphs
        if not check.own:
            refuse_unservable(check)
        if as_json:
            files = orjson.loads((path / MANIFEST).read_bytes())["files"]  # verified just now
            print_json({"version": number, "name": version_name(number), "path": str(path), "files": files})
        else:
            console.print(f"{version_name(number)} exported: {path}", highlight=False)


@app.command("materialize")
def materialize_(
    version: str = VersionArg,
    out: Path = typer.Argument(
        ..., help="A new directory for the full snapshot", metavar="OUT", parser=path_given
    ),
    snapshot_dir: Path | None = DirOption,
    as_json: bool = JsonOption,
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Write a full (non-delta) snapshot of a version to OUT: its delta chain applied, every
    tensor whole, checked like any version. OUT is outside the snapshot directory (name it
    v000007 in a folder of its own, and `--snapshot-dir` that folder lists it).
    """
    from streamrec.snapshots.materialize import materialize

    with cli_errors():
        store = open_store(snapshot_dir, log_level, config_file)
        number = store.resolve(version)
        manifest = materialize(store, number, out)
        if as_json:
            print_json({"version": number, "name": version_name(number), "path": str(out),
                         "files": manifest.files})
        else:
            console.print(f"{version_name(number)} written in full: {out}", highlight=False)
