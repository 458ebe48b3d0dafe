"""The backtest: recorded events -> samples -> micro-batches -> every strategy -> a report.

No broker and no Redis: the consumers' logic runs on the in-memory store and the learners
in this process (or in ``jobs`` processes, one strategy each), so a backtest is fast and the
same data, configuration and seed give the same report (its ``digest``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from streamrec.config import ModelConfig, StreamrecConfig
from streamrec.datasets import load_events
from streamrec.errors import EMPTY_PATH, ConfigError
from streamrec.features import FeatureSchema
from streamrec.learner.registry import reads_model_settings
from streamrec.replay import ablation, intake
from streamrec.replay.batches import MicroBatch, by_count, by_interval, replay_events
from streamrec.replay.coldstart import cold_start
from streamrec.replay.dump import dump_samples
from streamrec.replay.processes import run_in_processes
from streamrec.replay.report import SCHEMA, finish, summarise, tells
from streamrec.replay.strategies import (
    DEFAULT_EWC_LAMBDA,
    DEFAULT_KINDS,
    KINDS,
    Kind,
    Progress,
    Strategy,
    StrategyRun,
    run_strategy,
)
from streamrec.replay.vw import require_vw
from streamrec.samples import Sample

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BacktestConfig:
    """What to replay and how: the data, the micro-batch cut, the strategies."""

    source: str  # a dataset path, or synthetic[:field=value,...]
    fmt: str = "auto"
    limit: int | None = None  # the earliest events only
    interval_ms: int | None = None  # micro-batches by event time; None: by count
    batch_size: int = 2_500  # samples per micro-batch when cut by count (the demo's)
    strategies: tuple[Kind, ...] = DEFAULT_KINDS
    warmup: float = 0.25
    retrain_every: int = 10
    ewc_lambdas: tuple[float, ...] = ()  # empty: the model's own, DEFAULT_EWC_LAMBDA if that is 0
    seed: int | None = None  # both seeds (sampler's, model's); None: the settings' own
    jobs: int = 1
    # write every micro-batch's samples here (JSON lines); a str or os.PathLike is made a Path
    dump_samples: Path | str | os.PathLike[str] | None = None
    settings: StreamrecConfig = field(default_factory=StreamrecConfig)  # consumer, model, features
    # Declared features to remove one at a time (rerunning the strategies without each); "all": every one
    ablate: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Refuse settings no run can have, before any work, naming the flag that sets each.

        A ``dump_samples`` given as a string (or ``os.PathLike``) is taken as its path.

        Raises:
            ConfigError: the first such setting, or a strategy no backtest knows.
            TypeError: a count that is not an int, a ``warmup`` not a number, ``settings`` not a
                `StreamrecConfig`, names given as one string, or a ``dump_samples`` that is no path.
        """
        for name in ("limit", "interval_ms", "batch_size", "retrain_every", "seed", "jobs"):
            value = getattr(self, name)
            if not (value is None or (isinstance(value, int) and not isinstance(value, bool))):
                raise TypeError(f"BacktestConfig.{name} must be an int, not {value!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int | float):
            raise TypeError(f"BacktestConfig.warmup must be a number, not {self.warmup!r}")
        if not isinstance(self.settings, StreamrecConfig):
            got = type(self.settings).__name__
            raise TypeError(f"BacktestConfig.settings must be a StreamrecConfig (load_config()), not {got}")
        for name in ("strategies", "ewc_lambdas", "ablate"):
            if isinstance(names := getattr(self, name), str):  # a string is a tuple of letters
                raise TypeError(f"BacktestConfig.{name} must be a tuple of names, not {names!r}")
        if self.dump_samples is not None:
            object.__setattr__(self, "dump_samples", _dump_path(self.dump_samples))  # frozen: set once, here
        if not self.strategies:
            raise ConfigError(f"--strategies names none; name some of {', '.join(KINDS)}")
        if unknown := [k for k in self.strategies if k not in KINDS]:
            raise ConfigError(f"unknown strateg(ies) {unknown}; expected some of {', '.join(KINDS)}")
        checks = (
            ("--limit", self.limit, self.limit is None or self.limit >= 1, "a positive number of events"),
            ("--interval", self.interval_ms, self.interval_ms is None or self.interval_ms >= 1, "positive"),
            ("--batch-size", self.batch_size, self.batch_size >= 1, "at least 1"),
            ("--warmup", self.warmup, 0 <= self.warmup <= 1, "a fraction from 0 to 1"),
            ("--retrain-every", self.retrain_every, self.retrain_every >= 1, "at least 1"),
            ("--jobs", self.jobs, self.jobs >= 1, "at least 1"),
        )
        for flag, value, fine, wanted in checks:
            if not fine:
                raise ConfigError(f"{flag} must be {wanted}, not {value}")
        # a report keys its rows by name: a name twice would run twice and show once
        once("--strategies", self.strategies)
        once("--ewc-lambda", self.ewc_lambdas)
        once("--ablate", self.ablate)
        for lam in self.ewc_lambdas:
            validated(self.settings.model, "--ewc-lambda", ewc_lambda=lam)

    @property
    def dump_path(self) -> Path | None:
        """Where the samples are dumped (`dump_samples` as the `Path` it is made), if anywhere."""
        return None if self.dump_samples is None else Path(self.dump_samples)

    @property
    def schema(self) -> FeatureSchema:
        """The deployment's feature schema: the settings' (STREAMREC_FEATURES, streamrec.toml)."""
        return self.settings.feature_schema()


def _dump_path(given: object) -> Path:
    """``given`` (`BacktestConfig.dump_samples`) as a `Path` to a file, refused at once if it is none.

    Raises:
        TypeError: not a str or os.PathLike.
        ConfigError: empty, or a directory (from Python it failed after the whole replay).
    """
    text = os.fspath(given) if isinstance(given, str | os.PathLike) else None
    if not isinstance(text, str):  # bytes too: a Path is made of text
        raise TypeError(f"BacktestConfig.dump_samples must be a path (a str or os.PathLike), not {given!r}")
    if not text:
        raise ConfigError(f"--dump-samples '': {EMPTY_PATH}")
    path = Path(text)
    if path.is_dir():
        raise ConfigError(f"--dump-samples {text!r} is a directory: name a file in it")
    return path


def once(flag: str, values: Sequence[object]) -> None:
    """Refuse a value ``flag`` gives twice.

    Raises:
        ConfigError: the first value given twice, and ``flag``.
    """
    twice = next((value for value in values if values.count(value) > 1), None)
    if twice is not None:  # a λ of 0 too
        raise ConfigError(f"{flag} names {twice!r} twice: name each once")


def validated(model: ModelConfig, flag: str, **update: Any) -> ModelConfig:
    """``model`` with ``update``, checked by the settings' own bounds (``model_copy`` checks none).

    Raises:
        ConfigError: ``flag`` (what set the value) and what the setting wants.
    """
    try:
        return type(model).model_validate({**model.model_dump(), **update})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"{flag} {first['input']!r}: {first['msg'].lower()}") from exc


def seeded(cfg: BacktestConfig, schema: FeatureSchema | None = None) -> StreamrecConfig:
    """The settings with ``cfg.seed``, if given, as both the negative sampler's and the model's seed.

    Without one the settings keep their own (``STREAMREC_CONSUMER__SEED``, ``STREAMREC_MODEL__SEED``).

    With ``schema``, its declared features replace the settings' (an ablation's reduced schema),
    so that what a run records of its settings is what it ran with.
    """
    s = cfg.settings
    update: dict[str, Any] = {}
    if cfg.seed is not None:
        update["consumer"] = s.consumer.model_copy(update={"seed": cfg.seed})
        update["model"] = s.model.model_copy(update={"seed": cfg.seed})
    if schema is not None:
        update["features"] = schema.extras
    return s.model_copy(update=update)


def ewc_lambdas(cfg: BacktestConfig, settings: StreamrecConfig) -> tuple[float, ...]:
    """The λ values the ewc strategy runs at: ``cfg``'s, else the model's, else the default."""
    return cfg.ewc_lambdas or (settings.model.ewc_lambda or DEFAULT_EWC_LAMBDA,)


def strategies_of(
    cfg: BacktestConfig, settings: StreamrecConfig, schema: FeatureSchema | None = None
) -> list[Strategy]:
    """The strategies to run, ``ewc`` once per λ, their learners made under ``schema``.

    ``schema`` defaults to the settings' own.
    """
    schema = settings.feature_schema() if schema is None else schema
    out = []
    for kind in cfg.strategies:
        lambdas: Sequence[float | None] = (cfg.ewc_lambdas or (None,)) if kind == "ewc" else (None,)
        for lam in lambdas:
            name = kind if len(lambdas) == 1 else f"ewc λ={lam:g}"
            out.append(Strategy(name, kind, settings.model, cfg.warmup, cfg.retrain_every, lam, schema))
    return out


def micro_batches(
    cfg: BacktestConfig, settings: StreamrecConfig, schema: FeatureSchema | None = None
) -> tuple[dict[str, Any], list[MicroBatch]]:
    """What became of the events (`samples_of`) and their samples cut into micro-batches.

    The samples have ``schema``'s features (default: the settings' own).
    """
    dataset, samples = samples_of(cfg, settings, schema)
    if cfg.interval_ms is None:
        return dataset, by_count(samples, cfg.batch_size, settings.learner.min_eval_samples)
    return dataset, by_interval(samples, cfg.interval_ms)


def samples_of(
    cfg: BacktestConfig, settings: StreamrecConfig, schema: FeatureSchema | None = None
) -> tuple[dict[str, Any], list[Sample]]:
    """The samples of ``cfg``'s events, and the report's counts of what became of the events.

    ``events`` and the consumers' counts (`streamrec.replay.intake.Replayed.section`): dead
    letters, duplicates, late events, undecided impressions; and how many events carry each
    declared feature. Each count that is not zero (a feature's that is) is logged as a warning
    too: a record the backtest did not score is never dropped without a word.
    """
    schema = settings.feature_schema() if schema is None else schema
    events = load_events(cfg.source, cfg.fmt, limit=cfg.limit, schema=schema, to_replay=True)
    replayed = replay_events(events, settings, schema)
    intake.check_scorable(events, replayed, settings.consumer)
    dataset = {"events": len(events), **replayed.section(), "features": intake.coverage(events, schema)}
    for line in intake.summary(dataset):
        logger.warning("%s: %s", cfg.source, line)
    return dataset, replayed.samples


def run_all(
    strategies: Sequence[Strategy], batches: Sequence[MicroBatch], jobs: int, on_progress: Progress | None
) -> list[StrategyRun]:
    """Each strategy over the same micro-batches, in this process or in ``jobs`` processes."""
    if jobs <= 1:
        return [run_strategy(s, batches, on_progress) for s in strategies]
    return run_in_processes(strategies, batches, jobs, on_progress)


def backtest(cfg: BacktestConfig, on_progress: Progress | None = None) -> dict[str, Any]:
    """Run the backtest ``cfg`` describes; returns the report (see ``streamrec.replay.report``).

    The report is the JSON schema's as a dict, but for its undefined figures (a baseline's
    ``backward_auc``, say): NaN here, null as `streamrec.replay.report.to_json` writes it
    (``json.dumps`` would write ``NaN``, which JSON does not allow).
    """
    start = time.perf_counter()
    if "vw" in cfg.strategies:
        require_vw()  # before minutes of sample building, not after
    schema = cfg.schema
    removed = ablation.ablated(cfg.ablate, schema)  # a name not declared: now, not after the runs
    settings = seeded(cfg, schema)
    dataset, batches = micro_batches(cfg, settings, schema)
    if cfg.dump_path is not None:
        dump_samples(batches, cfg.dump_path)
    strategies = strategies_of(cfg, settings, schema)
    runs = run_all(strategies, batches, cfg.jobs, on_progress)
    summaries = {run.name: summarise(run, batches) for run in runs}
    report = {
        "schema": SCHEMA,
        "dataset": _dataset(cfg, dataset, [s for b in batches for s in b.samples]),
        "config": _config(cfg, settings, schema),
        "micro_batches": {
            "count": len(batches),
            "first_ts": [b.first_ts for b in batches],
            "last_ts": [b.last_ts for b in batches],
            "samples": [len(b.samples) for b in batches],
        },
        "strategies": summaries,
        "tells": tells(batches),
        "cold_start": cold_start(runs, batches),
    }
    if removed:
        report["ablation"] = ablate(cfg, schema, batches, summaries, removed, on_progress)
    report["wall_seconds"] = time.perf_counter() - start
    return finish(report)


def ablate(
    cfg: BacktestConfig,
    schema: FeatureSchema,
    batches: Sequence[MicroBatch],
    summaries: dict[str, dict[str, Any]],
    removed: Sequence[str],
    on_progress: Progress | None = None,
) -> dict[str, Any]:
    """The report's ``ablation``: the strategies rerun without each of ``removed`` in turn.

    Each rerun takes the same micro-batches with the feature stripped from every sample, and
    learners made under the schema without it; ``summaries`` are the runs with every feature.
    """
    reduced: dict[str, dict[str, dict[str, Any]]] = {}
    for name in removed:
        smaller = ablation.without(schema, {name})
        stripped = ablation.strip_batches(batches, {name})
        strategies = strategies_of(cfg, seeded(cfg, smaller), smaller)
        shown = [dataclasses.replace(s, name=f"{s.name} −{name}") for s in strategies]  # in the progress bar
        runs = run_all(shown, stripped, cfg.jobs, on_progress)
        reduced[name] = {s.name: summarise(run, stripped) for s, run in zip(strategies, runs, strict=True)}
    return ablation.section(removed, summaries, reduced)


def _dataset(cfg: BacktestConfig, counts: dict[str, Any], samples: Sequence[Sample]) -> dict[str, Any]:
    """The report's ``dataset``: the source, what became of its events (`samples_of`), the samples."""
    positives = sum(s.label for s in samples)
    return {"source": cfg.source, **counts, "samples": len(samples), "positives": positives}


def _config(cfg: BacktestConfig, settings: StreamrecConfig, schema: FeatureSchema) -> dict[str, Any]:
    cut = {"batch_size": cfg.batch_size} if cfg.interval_ms is None else {"interval_ms": cfg.interval_ms}
    return {
        **cut,
        "limit": cfg.limit,
        "warmup": cfg.warmup,
        "retrain_every": cfg.retrain_every,
        "ewc_lambdas": list(ewc_lambdas(cfg, settings)),
        "seed": settings.model.seed,  # the sampler's is the consumer's below
        "consumer": settings.consumer.model_dump(mode="json"),
        "model": settings.model.model_dump(mode="json"),
        # the declared extras (item and category are every schema's); [] for the default schema
        "features": [f.meaning() for f in schema.extras],
    }


# What a sweep row reports of each run: quality, forgetting, EWC's pull, cost.
SWEPT: tuple[Kind, ...] = ("finetune", "ewc")  # the strategies a sweep runs: the incremental model
SWEEP_FIGURES = ("auc", "gauc", "backward_auc", "forgetting", "penalty_share", "train_seconds")


def check_sweep(
    cfg: BacktestConfig, intervals_ms: Sequence[int | None], learning_rates: Sequence[float],
    passes: Sequence[int],
) -> None:
    """Refuse a sweep's values that its settings refuse, and a backtest's outputs, naming the flag.

    Raises:
        ConfigError: a learning rate or passes the model settings refuse, an interval under 1 ms,
            an ablation or a samples dump asked of the sweep (a backtest's: each interval cuts
            its own micro-batches), or strategies it does not sweep (any but `SWEPT`, unless
            ``cfg.strategies`` is left at its default).
    """
    if cfg.ablate:
        raise ConfigError("--ablate is for a backtest, not a --sweep: run them one after the other")
    if cfg.dump_samples is not None:
        raise ConfigError("--dump-samples is for a backtest, not a --sweep: run a backtest for the samples")
    if cfg.strategies != DEFAULT_KINDS and (others := [k for k in cfg.strategies if k not in SWEPT]):
        raise ConfigError(
            f"--strategies {','.join(others)}: a --sweep runs {' and '.join(SWEPT)} only; name those, "
            "or leave --strategies out for both"
        )
    for flag, values in (("--sweep-intervals", intervals_ms), ("--sweep-lrs", learning_rates),
                         ("--sweep-passes", passes)):
        once(flag, values)  # a row twice would cost a run
    learner = cfg.settings.model.learner
    if (len(learning_rates) > 1 or len(passes) > 1) and not reads_model_settings(learner):
        raise ConfigError(
            f"--sweep-lrs and --sweep-passes set model settings, and STREAMREC_MODEL__LEARNER={learner} "
            "reads no model settings (no from_config): its rows would differ in name only; give "
            "each one value, and sweep --sweep-intervals or --ewc-lambda"
        )
    for lr in learning_rates:
        validated(cfg.settings.model, "--sweep-lrs", learning_rate=lr)
    for n in passes:
        validated(cfg.settings.model, "--sweep-passes", passes=n)
    if bad := [i for i in intervals_ms if i is not None and i < 1]:
        raise ConfigError(f"--sweep-intervals must be positive, not {bad[0]} ms")


def sweep(
    cfg: BacktestConfig,
    intervals_ms: Sequence[int | None],
    learning_rates: Sequence[float],
    passes: Sequence[int] = (1,),
    on_progress: Progress | None = None,
) -> dict[str, Any]:
    """GAUC against cost over micro-batch intervals, learning rates, passes per micro-batch and EWC's λ.

    The report: what the dataset gave (as a backtest's ``dataset``), the settings swept from
    (``config``), and under ``sweep`` one row per combination (the incremental DIN:
    ``finetune``, or ``ewc`` at each λ; those of the two ``cfg.strategies`` names).
    """
    check_sweep(cfg, intervals_ms, learning_rates, passes)  # before the samples are built, not after
    start = time.perf_counter()
    schema = cfg.schema
    settings = seeded(cfg, schema)
    dataset, samples = samples_of(cfg, settings, schema)
    rows: list[dict[str, Any]] = []
    for interval in intervals_ms:
        batches = (
            by_count(samples, cfg.batch_size, settings.learner.min_eval_samples)
            if interval is None else by_interval(samples, interval)
        )
        variants: list[tuple[Kind, float | None]] = []
        if "finetune" in cfg.strategies:
            variants.append(("finetune", None))
        if "ewc" in cfg.strategies:
            variants += [("ewc", lam) for lam in ewc_lambdas(cfg, settings)]
        combos = [
            Strategy(
                f"{kind} lr={lr:g} passes={n}" + (f" λ={lam:g}" if lam is not None else ""),
                kind, validated(settings.model, "--sweep", learning_rate=lr, passes=n), ewc_lambda=lam,
                schema=schema,
            )
            for lr in learning_rates
            for n in passes
            for kind, lam in variants
        ]
        for strategy, run in zip(combos, run_all(combos, batches, cfg.jobs, on_progress), strict=True):
            summary = summarise(run, batches)
            rows.append({
                "interval_ms": interval,
                "batch_size": cfg.batch_size if interval is None else None,
                "micro_batches": len(batches),
                "learning_rate": strategy.model.learning_rate,
                "passes": strategy.model.passes,
                "strategy": strategy.kind,
                "ewc_lambda": strategy.ewc_lambda,
                **{k: summary[k] for k in SWEEP_FIGURES},
            })
    return {
        "schema": SCHEMA,
        "dataset": _dataset(cfg, dataset, samples),
        "config": _config(cfg, settings, schema),
        "sweep": rows,
        "wall_seconds": time.perf_counter() - start,
    }
