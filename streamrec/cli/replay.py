"""``streamrec replay backtest|publish``: backtest update strategies on recorded events, or
send a dataset into Kafka at a multiple of its own event time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from streamrec.cli.common import build_config, cli_errors, command_group, console, format_duration
from streamrec.cli.options import ConfigFile, LogLevel, dataset_format, dataset_limit, path_given, setting
from streamrec.errors import ConfigError
from streamrec.wording import plural

app = command_group("Backtest update strategies on recorded events; replay them into Kafka.")

_DATASET = typer.Argument(
    ..., help="Taobao CSV, MovieLens dir, ML-100K u.data, JSONL, or synthetic[:events=N,...]"
)


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _numbers(text: str, flag: str, kind: type[float] | type[int] = float) -> list[Any]:
    """A comma-separated list of numbers, or a one-line error naming ``flag``."""
    try:
        return [kind(x) for x in _csv(text)]
    except ValueError as exc:
        raise ConfigError(f"{flag} {text!r}: not a comma-separated list of {kind.__name__}s") from exc


@app.command("backtest")
def backtest(
    dataset: str = _DATASET,
    fmt: str = dataset_format(),
    limit: int | None = dataset_limit(),
    interval: str | None = typer.Option(
        None, help="Micro-batches by event time, e.g. 10m, 1h, 1d", show_default="by count, --batch-size"
    ),
    batch_size: int | None = typer.Option(
        None, help="Samples per micro-batch when there is no --interval", show_default="2500"
    ),
    strategies: str = typer.Option(
        "popularity,item-rate,features,static,finetune,ewc,retrain",
        help="Comma-separated strategies; also deepfm (the second model), and vw (Vowpal Wabbit: "
        "pip install 'streamrec[vw]')",
        show_default="popularity, item-rate, features, static, finetune, ewc, retrain",  # spaced: wraps whole
    ),
    warmup: float | None = typer.Option(
        None, help="static: the fraction of micro-batches it trains on", show_default="0.25"
    ),
    retrain_every: int | None = typer.Option(
        None, help="retrain: micro-batches between retrains", show_default="10"
    ),
    ewc_lambda: str = typer.Option(
        "", help="ewc: comma-separated λ values", show_default="STREAMREC_MODEL__EWC_LAMBDA, or 0.1 if 0"
    ),
    seed: int | None = typer.Option(
        None, help="Seed of the negative sampler and the model",
        show_default="STREAMREC_CONSUMER__SEED and STREAMREC_MODEL__SEED (0)",
    ),
    jobs: int = typer.Option(1, help="Strategies run in this many processes"),
    report: Path | None = typer.Option(
        None, "--report", help="Write the JSON report here, with .md and .png beside it",
        show_default="not written", metavar="<path>", parser=path_given,
    ),
    dump_samples: Path | None = typer.Option(
        None,
        "--dump-samples",
        help='Write every sample as a JSON line {"micro_batch": N, "sample": {...}} here',
        show_default="not written",
        metavar="<path>",
        parser=path_given,
    ),
    ablate: str = typer.Option(
        "", help="Rerun the strategies without each declared feature in turn (on the same samples): "
        "all, or comma-separated feature names", show_default="no ablation",
    ),
    sweep: bool = typer.Option(
        False, help="Sweep interval, learning rate, passes and EWC's λ instead (GAUC against cost)"
    ),
    sweep_intervals: str = typer.Option(
        "", help="--sweep: comma-separated intervals", show_default="--interval"
    ),
    sweep_lrs: str = typer.Option("0.0003,0.001,0.003", help="--sweep: comma-separated learning rates"),
    sweep_passes: str = typer.Option("1", help="--sweep: comma-separated passes per micro-batch"),
    device: str | None = setting("model.device"),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Replay DATASET through the consumers' logic and every strategy, each micro-batch scored
    before any strategy trains on it; print the table, write the report.
    """
    # Paddle now, before the progress display's thread: its import keeps SIGTERM from Paddle's
    # handler only while the importing thread is the process's one thread (streamrec.paddlesignals).
    import paddle  # noqa: F401

    from streamrec.kernelsettings import prefer_vector_kernels
    from streamrec.loopsettings import before_training_loop
    from streamrec.replay import ablation as ab
    from streamrec.replay import backtest as bt
    from streamrec.replay import report as rp
    from streamrec.replay.batches import parse_duration

    with cli_errors():
        before_training_loop()
        prefer_vector_kernels()
        kinds = _csv(strategies)  # BacktestConfig checks the names
        if batch_size is not None and (interval is not None or (sweep and _csv(sweep_intervals))):
            cut = "--interval" if interval is not None else "--sweep-intervals"
            raise ConfigError(
                f"--batch-size cuts micro-batches by count and {cut} by event time: give one of them"
            )
        _writable(report, "--report")
        _writable(dump_samples, "--dump-samples")
        _apart(dump_samples, report)
        _unused(strategies, kinds, sweep, {
            "--ewc-lambda": bool(_csv(ewc_lambda)), "--warmup": warmup is not None,
            "--retrain-every": retrain_every is not None,
        })
        if report is not None and report.suffix != ".json":
            raise ConfigError(
                f"--report {str(report)!r} must end in .json: the table (.md) and the plot (.png) are "
                "written beside it, by its name"
            )
        cfg = bt.BacktestConfig(
            source=dataset, fmt=fmt, limit=limit,
            interval_ms=None if interval is None else parse_duration(interval),
            batch_size=bt.BacktestConfig.batch_size if batch_size is None else batch_size,
            strategies=tuple(kinds),  # type: ignore[arg-type]  # BacktestConfig checks them
            warmup=bt.BacktestConfig.warmup if warmup is None else warmup,
            retrain_every=bt.BacktestConfig.retrain_every if retrain_every is None else retrain_every,
            ewc_lambdas=tuple(_numbers(ewc_lambda, "--ewc-lambda")), seed=seed, jobs=jobs,
            dump_samples=dump_samples, ablate=tuple(_csv(ablate)),
            settings=build_config(
                quiet=True, log_level=log_level, config_file=config_file, model={"device": device}
            ),
        )
        if sweep:
            intervals: list[int | None] = [parse_duration(i) for i in _csv(sweep_intervals)]
            intervals = intervals or [cfg.interval_ms]
            lrs, passes = _numbers(sweep_lrs, "--sweep-lrs"), _numbers(sweep_passes, "--sweep-passes", int)
            bt.check_sweep(cfg, intervals, lrs, passes)  # as sweep() does, but before the progress display
        with _progress() as on_progress:
            if sweep:
                result = bt.sweep(cfg, intervals, lrs, passes, on_progress)
            else:
                result = bt.backtest(cfg, on_progress)
        if sweep:
            tables, plot = [rp.sweep_table(result["sweep"])], None
        else:
            tables = [rp.markdown_table(result), rp.tells_table(result), ab.table(result), _verdict(result)]
            plot = functools.partial(rp.plot, result)
        table = "\n\n".join(t for t in tables if t)
        console.print(table, highlight=False)
        _write(report, rp.to_json(result), table + "\n", plot)


def _verdict(report: dict[str, Any]) -> str:
    """Which strategy wins on GAUC, at what cost, and how the learner compares with the baselines.

    It beats the best of them, ties with it or is behind it, by more than the noise of its
    micro-batches or not (`streamrec.replay.report.versus_baselines`).
    """
    from streamrec.replay.report import CLEAR_BY_SE

    strategies = report["strategies"]
    best = report["best"]["gauc"]
    if best is None:
        return _unscored(report)
    winner = strategies[best]
    tied = report.get("tied_with_best", {}).get("gauc", [])
    ties = f"; {', '.join(tied)} {'tie' if len(tied) > 1 else 'ties'} with it" if tied else ""
    line = f"best GAUC: {best} ({winner['gauc']:.4f}, {winner['train_seconds']:.1f} s training{ties})"
    versus = report.get("versus_baselines")
    if versus is None:
        return line
    said = {
        "beats": "beats", "ties": "ties with", "behind": "does NOT beat",
        "unknown": "cannot yet be told from",
    }[versus["outcome"]]
    learner = report.get("config", {}).get("model", {}).get("learner", "din")
    model = {"din": "DIN", "deepfm": "DeepFM"}.get(learner, learner)  # finetune trains the chosen one
    line += f"; the incremental {model} (finetune) {said} the best simple baseline ({versus['baseline']})"
    line += " on GAUC"
    if versus["outcome"] == "unknown":
        return line + " (one micro-batch: no spread to judge by)"
    return line + (
        f": {versus['difference']:+.4f} ± {CLEAR_BY_SE * versus['stderr']:.4f} over the whole run "
        f"({CLEAR_BY_SE:g} standard errors of the paired difference over {versus['micro_batches']} "
        "micro-batches)"
    )


def _unscored(report: dict[str, Any]) -> str:
    """Why no strategy has a GAUC, and the best AUC if there is one.

    GAUC ranks each user's own samples of one micro-batch, so it needs a user with both labels
    in one; AUC only both labels in one micro-batch.
    """
    line = "no GAUC: no user has both a positive and a negative sample in one micro-batch"
    best_auc = report["best"]["auc"]
    if best_auc is None:
        return (
            f"{line}; no AUC either: no micro-batch holds both labels (a larger --batch-size or "
            "--interval puts more samples together)"
        )
    figure = report["strategies"][best_auc]["auc"]
    return f"{line} (GAUC ranks each user's own); best AUC: {best_auc} ({figure:.4f}), ranking across users"


def _writable(path: Path | None, flag: str) -> None:
    """Refuse an output path that cannot be written, before any replaying.

    Nothing is left behind: a folder it needs is made when the file is written, so a run that
    fails leaves none; here a file is written and deleted in the nearest folder that exists.

    Raises:
        ConfigError: ``flag`` and why: a directory, under a file, or no write there.
    """
    if path is None:
        return
    if path.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a directory: name a file in it")
    above = next(p for p in path.parents if p.exists())  # the root, at worst
    if not above.is_dir():
        raise ConfigError(f"{flag} {str(path)!r}: {above} is a file, not a directory")
    probe = above / f".{path.name}.tmp"  # in the file's folder, the name write_atomic uses
    try:
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{flag} {str(path)!r} cannot be written: {exc.strerror or exc}") from exc


def _unused(strategies: str, kinds: list[str], sweep: bool, given: dict[str, bool]) -> None:
    """Refuse a strategy's own flag where that strategy does not run: it would be dropped unsaid.

    Raises:
        ConfigError: naming the flag, its strategy, and why that does not run.
    """
    owners = {"--ewc-lambda": "ewc", "--warmup": "static", "--retrain-every": "retrain"}
    for flag, owner in owners.items():
        if not given[flag]:
            continue
        if sweep and owner != "ewc":  # a sweep runs finetune and ewc
            raise ConfigError(f"{flag} sets the {owner} strategy, which a --sweep does not run: drop it")
        if owner not in kinds:
            raise ConfigError(
                f"{flag} sets the {owner} strategy, which --strategies {strategies} leaves out: add "
                f"{owner}, or drop {flag}"
            )


def _apart(dump: Path | None, report: Path | None) -> None:
    """Refuse a samples dump named as the report or a file written beside it, which would replace it.

    Raises:
        ConfigError: naming both flags.
    """
    if dump is None or report is None:
        return
    ours = {p.resolve() for p in (report, report.with_suffix(".md"), report.with_suffix(".png"))}
    if dump.resolve() in ours:
        raise ConfigError(
            f"--dump-samples {str(dump)!r} is a file --report {str(report)!r} writes (the report, and "
            "its .md and .png beside it): the report would replace the samples; name another file"
        )


def _write(path: Path | None, payload: bytes, table: str, plot: Callable[[Path], None] | None) -> None:
    """The JSON report, with its table (.md) and a backtest's plot (.png) beside it.

    A sweep has no plot: one left beside its name by an earlier run is removed, as its table
    is replaced, so the three files are always of one run.
    """
    if path is None:
        return
    from streamrec.errors import OutputError
    from streamrec.fileio import write_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, payload)
        write_atomic(path.with_suffix(".md"), table.encode())
        if plot is None:
            path.with_suffix(".png").unlink(missing_ok=True)
        else:
            plot(path.with_suffix(".png"))
    except OSError as exc:
        raise OutputError(f"the report {path} could not be written: {exc.strerror or exc}") from exc
    console.print(f"report written to {path} (and .md{'' if plot is None else ', .png'} beside it)")


class _progress:
    """A progress bar fed by the backtest: strategy, micro-batch, the latest GAUC."""

    def __enter__(self) -> Any:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=True,
        )
        self._bar.__enter__()
        self._tasks: dict[str, Any] = {}
        return self.update

    def update(self, name: str, done: int, total: int, latest_gauc: float) -> None:
        task = self._tasks.get(name)
        if task is None:
            task = self._tasks[name] = self._bar.add_task(name, total=total)
        gauc = "" if latest_gauc != latest_gauc else f"  GAUC {latest_gauc:.3f}"  # NaN: unknown
        self._bar.update(task, completed=done, description=f"{name:<16}{gauc}")

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(None, None, None)


@app.command("publish")
def publish(
    dataset: str = _DATASET,
    fmt: str = dataset_format(),
    speedup: float = typer.Option(60.0, help="Multiple of the data's own event time (60: an hour a minute)"),
    limit: int | None = dataset_limit(),
    bootstrap_servers: str | None = setting("kafka.bootstrap_servers"),
    events_topic: str | None = setting("kafka.events_topic"),
    log_level: str | None = LogLevel,
    config_file: Path | None = ConfigFile,
) -> None:
    """Send DATASET to the events topic at SPEEDUP times its own pace, for end-to-end runs
    against live consumers and learner.
    """
    from streamrec.datasets import load_events
    from streamrec.kafka.topics import ensure_topics
    from streamrec.producer import publish as publish_events

    with cli_errors():
        if not speedup > 0:  # nan too
            raise ConfigError(f"--speedup must be positive, not {speedup}")
        cfg = build_config(
            log_level=log_level,
            config_file=config_file,
            kafka={"bootstrap_servers": bootstrap_servers, "events_topic": events_topic},
        )
        events = load_events(dataset, fmt, limit=limit, schema=cfg.feature_schema(), to_replay=True)
        ensure_topics(cfg.kafka)
        span = format_duration((events[-1].ts - events[0].ts) / 1000 / speedup)  # events: refused if none
        console.print(f"publishing {plural(len(events), 'event')} over {span} ({speedup:g}x event time)")
        sent = publish_events(events, cfg.kafka, speedup=speedup)
        console.print(f"published {plural(sent, 'event')} to {cfg.kafka.events_topic}")
