"""The backtest report: figures per strategy, as JSON, a markdown table and a plot.

JSON schema (``schema`` 1), times in epoch ms, NaN as null:

- ``dataset``: ``source``, ``events``, ``samples``, ``positives``, and what the consumers'
  logic made no sample of (`streamrec.replay.intake`): ``dead_letters`` (``count``,
  ``by_reason``, ``examples``), ``duplicates``, ``late``, ``late_labels``, ``undecided``,
  ``negatives_short``;
- ``config``: the micro-batch cut (``interval_ms`` or ``batch_size``), ``warmup``,
  ``retrain_every``, ``model`` and ``consumer`` settings: everything that shaped the run;
- ``micro_batches``: ``count`` and per micro-batch ``first_ts``, ``last_ts``, ``samples``;
- ``strategies.<name>``: ``kind``; prequential
  ``auc`` and ``gauc``, sample-weighted means of the per-micro-batch figures over the whole
  run (a ranking is judged among what is scored together: pooling years of one user's
  samples would mix the rankings of different model versions), ``logloss`` over every
  sample; ``auc_last_3q`` and ``gauc_last_3q``, the same means over the last three quarters
  (the demo's summary); ``auc_first_q`` and ``gauc_first_q``, over the first quarter (at
  least one micro-batch: the cold start); ``auc_pooled`` and ``gauc_pooled``, over all
  samples pooled;
  ``backward_auc`` (the final model on the probes of earlier micro-batches) and
  ``forgetting`` (their AUC right after training on them, minus that);
  ``penalty_share``, the EWC penalty's mean share of the training loss (0 without EWC);
  ``train_seconds`` and ``score_seconds`` (cost); ``series`` of per-micro-batch ``auc``,
  ``gauc``, ``logloss``, ``samples``;
- ``tells.<feature>``: each causal match feature (`streamrec.learner.match`) scored
  alone, ``auc``, ``gauc``, ``auc_first_q``, ``gauc_first_q`` as a strategy's: they depend
  on the samples only, so once per backtest. On real impressions near 0.5; well above it
  the negative sampler gives the label away, and a strategy's figures measure the sampler;
- ``cold_start.new_items`` and ``cold_start.new_users``: each strategy on the samples of
  new items and of new users, with and without the cold-start fallback
  (`streamrec.replay.coldstart`);
- ``best``: the strategy with the highest ``gauc`` and ``auc``; ``tied_with_best``, for each,
  the strategies as good for all the run can tell (`tied_with_best`);
- ``versus_baselines``: the incremental DIN (``finetune``) against the best of the simple
  baselines on GAUC (`paired`): ``strategy``, ``baseline``, ``metric``, ``difference``,
  ``stderr``, ``micro_batches`` and ``outcome``, ``beats``, ``ties`` or ``behind`` (``unknown``
  from one micro-batch); null when the run has not both;
- ``wall_seconds``; ``digest``: the sha256 of the report without its timings, equal for
  runs with the same data, configuration and seed.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamrec.fileio import write_atomic
from streamrec.learner.columns import SampleColumns
from streamrec.learner.match import match_features
from streamrec.learner.metrics import auc, gauc, logloss
from streamrec.replay.batches import MicroBatch
from streamrec.replay.strategies import StrategyRun, probe

SCHEMA = 1
#: The simple baselines every model must beat (`streamrec.replay.baselines`), by strategy name.
BASELINES = ("popularity", "item-rate", "features", "vw")
#: Standard errors a difference must clear to count as one: about 95% two-sided.
CLEAR_BY_SE = 2.0
# Wall-clock figures: the only ones that differ between two runs of the same backtest.
TIMINGS = frozenset({"train_seconds", "score_seconds", "wall_seconds"})


def summarise(run: StrategyRun, batches: Sequence[MicroBatch]) -> dict[str, Any]:
    """One strategy's figures (see the module docstring)."""
    columns = [SampleColumns.from_samples(b.samples) for b in batches]
    labels = [c.label for c in columns]
    pairs = list(zip(columns, run.scores, strict=True))
    aucs = [auc(c.label, s) for c, s in pairs]
    gaucs = [gauc(c.label, s, c.user_ids) for c, s in pairs]
    sizes = [len(c) for c in columns]
    losses = [logloss(c.label, s) for c, s in pairs]
    series = {"auc": aucs, "gauc": gaucs, "logloss": losses, "samples": sizes}
    later, first = slice(len(batches) // 4, None), _first_quarter(batches)
    pooled_users = np.concatenate([c.user_ids for c in columns]) if columns else np.array([])
    return {
        "kind": run.kind,
        "auc": _weighted(aucs, sizes),
        "gauc": _weighted(gaucs, sizes),
        "logloss": logloss(_cat(labels), _cat(run.scores)),
        "auc_last_3q": _weighted(aucs[later], sizes[later]),
        "gauc_last_3q": _weighted(gaucs[later], sizes[later]),
        "auc_first_q": _weighted(aucs[first], sizes[first]),
        "gauc_first_q": _weighted(gaucs[first], sizes[first]),
        "auc_pooled": auc(_cat(labels), _cat(run.scores)),
        "gauc_pooled": gauc(_cat(labels), _cat(run.scores), pooled_users),
        **_backward(run, batches),
        "penalty_share": _weighted(run.penalty_shares, [1] * len(run.penalty_shares)),
        "train_seconds": run.train_seconds,
        "score_seconds": run.score_seconds,
        "series": series,
    }


def _first_quarter(batches: Sequence[MicroBatch]) -> slice:
    return slice(0, max(1, len(batches) // 4))


def tells(batches: Sequence[MicroBatch]) -> dict[str, dict[str, float]]:
    """Each match feature scored alone, per micro-batch as a strategy's scores (see above)."""
    columns = [SampleColumns.from_samples(b.samples) for b in batches]
    features = [match_features(c) for c in columns]
    sizes, first = [len(c) for c in columns], _first_quarter(batches)
    out = {}
    for name in features[0] if features else ():
        aucs = [auc(c.label, f[name]) for c, f in zip(columns, features, strict=True)]
        gaucs = [gauc(c.label, f[name], c.user_ids) for c, f in zip(columns, features, strict=True)]
        out[name] = {
            "auc": _weighted(aucs, sizes),
            "gauc": _weighted(gaucs, sizes),
            "auc_first_q": _weighted(aucs[first], sizes[first]),
            "gauc_first_q": _weighted(gaucs[first], sizes[first]),
        }
    return out


def _backward(run: StrategyRun, batches: Sequence[MicroBatch]) -> dict[str, float]:
    """Backward AUC of the final model on the probes, and the forgetting since each."""
    if not run.probe_final:
        return {"backward_auc": math.nan, "forgetting": math.nan}
    probes = {i: probe(batches[i]).label for i in run.probe_final}
    pooled = auc(_cat(list(probes.values())), _cat(list(run.probe_final.values())))
    drops, sizes = [], []
    for i, labels in probes.items():
        drop = auc(labels, run.probe_after[i]) - auc(labels, run.probe_final[i])
        if not math.isnan(drop):
            drops.append(drop)
            sizes.append(len(labels))
    return {"backward_auc": pooled, "forgetting": _weighted(drops, sizes)}


def _cat(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.array([])


def _weighted(values: Sequence[float], weights: Sequence[int]) -> float:
    """Weighted mean of the finite values; NaN when there are none."""
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if not math.isnan(v)]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else math.nan


def best(strategies: dict[str, dict[str, Any]], metric: str) -> str | None:
    """The strategy with the highest ``metric`` (ties: the first)."""
    scored = [(s[metric], name) for name, s in strategies.items() if not math.isnan(s[metric])]
    return max(scored, key=lambda pair: pair[0])[1] if scored else None


def paired(a: dict[str, Any], b: dict[str, Any], metric: str = "gauc") -> dict[str, float | int]:
    """Strategy ``a`` against ``b`` on ``metric``: the difference and its standard error.

    Both are scored on the same micro-batches, so each micro-batch gives one paired difference;
    their sample-weighted mean is the difference of the whole-run figures (which are such means).
    Its standard error comes from their spread, a micro-batch's variance taken as inversely
    proportional to its samples and the micro-batches as independent draws:
    ``sqrt(sum w (d - mean)^2 / ((k - 1) sum w))``. NaN from one micro-batch, but 0 where the
    two scored the same in every micro-batch: identical figures are a tie however few.
    """
    sa, sb = a["series"], b["series"]
    rows = [
        (x - y, w) for x, y, w in zip(sa[metric], sb[metric], sa["samples"], strict=True)
        if _scored(x) and _scored(y) and w
    ]
    total = sum(w for _, w in rows)
    mean = sum(d * w for d, w in rows) / total if total else math.nan
    spread = sum(w * (d - mean) ** 2 for d, w in rows)
    if rows and all(d == 0 for d, _ in rows):
        stderr = 0.0
    else:
        stderr = math.sqrt(spread / ((len(rows) - 1) * total)) if len(rows) > 1 else math.nan
    return {"difference": mean, "stderr": stderr, "micro_batches": len(rows)}


def _scored(value: float | None) -> bool:
    """Whether a micro-batch's figure is a number (NaN, or null as JSON writes it: unscored)."""
    return value is not None and not math.isnan(value)


def versus_baselines(
    strategies: dict[str, dict[str, Any]], strategy: str = "finetune", metric: str = "gauc"
) -> dict[str, Any] | None:
    """``strategy`` against the best of the `BASELINES` run: `paired`, judged by `_outcome`.

    None when the run has not both.
    """
    run = {n: s for n, s in strategies.items() if n in BASELINES and not math.isnan(s[metric])}
    if strategy not in strategies or not run:
        return None
    baseline = max(run, key=lambda name: run[name][metric])
    figures = paired(strategies[strategy], run[baseline], metric)
    outcome = _outcome(figures)
    return {"strategy": strategy, "baseline": baseline, "metric": metric, **figures, "outcome": outcome}


def _outcome(figures: dict[str, float | int]) -> str:
    """A `paired` comparison judged: ``beats``, ``behind``, ``ties`` or ``unknown``.

    ``beats`` or ``behind`` when its difference clears `CLEAR_BY_SE` standard errors, ``ties``
    when it does not, ``unknown`` from one micro-batch.
    """
    difference, stderr = figures["difference"], figures["stderr"]
    if math.isnan(stderr):
        return "unknown"
    if abs(difference) <= CLEAR_BY_SE * stderr:
        return "ties"
    return "beats" if difference > 0 else "behind"


def tied_with_best(strategies: dict[str, dict[str, Any]], metric: str) -> list[str]:
    """The strategies as good as the best on ``metric``, for all the run can tell.

    Those whose `paired` difference with the best is within `CLEAR_BY_SE` standard errors.
    """
    top = best(strategies, metric)
    if top is None:
        return []
    tied = []
    for name, s in strategies.items():
        if name != top and not math.isnan(s[metric]):
            if _outcome(paired(strategies[top], s, metric)) == "ties":
                tied.append(name)
    return tied


def finish(report: dict[str, Any]) -> dict[str, Any]:
    """Add ``best``, ``tied_with_best``, ``versus_baselines``, and the ``digest`` of the rest."""
    report["best"] = {m: best(report["strategies"], m) for m in ("gauc", "auc")}
    report["tied_with_best"] = {m: tied_with_best(report["strategies"], m) for m in ("gauc", "auc")}
    report["versus_baselines"] = versus_baselines(report["strategies"])
    report["digest"] = hashlib.sha256(to_json(_without_timings(report))).hexdigest()
    return report


def _without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in TIMINGS and k != "digest"}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def to_json(report: dict[str, Any]) -> bytes:
    """The report as sorted, indented JSON (NaN written as null)."""
    options = orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
    return orjson.dumps(report, option=options)


def markdown_table(report: dict[str, Any]) -> str:
    """One row per strategy: the headline figures and the cost."""
    rows = [
        "| strategy | AUC | GAUC | logloss | GAUC first 1/4 | AUC last 3/4 | GAUC last 3/4 | backward AUC "
        "| forgetting | train s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in report["strategies"].items():
        figures = (
            "auc", "gauc", "logloss", "gauc_first_q", "auc_last_3q", "gauc_last_3q", "backward_auc",
            "forgetting",
        )
        cells = " | ".join(_fmt(s[k]) for k in figures)
        rows.append(f"| {name} | {cells} | {s['train_seconds']:.1f} |")
    return "\n".join(rows)


def tells_table(report: dict[str, Any]) -> str:
    """One row per match feature scored alone: the sampler's tells, beside the strategies."""
    rows = [
        "| feature alone (tell) | AUC | GAUC | AUC first 1/4 | GAUC first 1/4 |",
        "|---|---|---|---|---|",
    ]
    for name, t in report.get("tells", {}).items():
        cells = " | ".join(_fmt(t[k]) for k in ("auc", "gauc", "auc_first_q", "gauc_first_q"))
        rows.append(f"| {name} | {cells} |")
    return "\n".join(rows)


def sweep_table(rows: Sequence[dict[str, Any]]) -> str:
    """The sweep as markdown: GAUC against cost per combination."""
    lines = [
        "| micro-batches | learning rate | passes | strategy | AUC | GAUC | backward AUC | forgetting "
        "| penalty share | train s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cut = f"{row['interval_ms'] / 60_000:g} min" if row["interval_ms"] else f"{row['batch_size']} samples"
        name = row["strategy"] + (f" λ={row['ewc_lambda']:g}" if row["ewc_lambda"] is not None else "")
        figures = " | ".join(
            _fmt(row[k]) for k in ("auc", "gauc", "backward_auc", "forgetting", "penalty_share")
        )
        lines.append(
            f"| {cut} ({row['micro_batches']}) | {row['learning_rate']:g} | {row['passes']} | {name} "
            f"| {figures} | {row['train_seconds']:.1f} |"
        )
    return "\n".join(lines)


def _fmt(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.4f}"


def plot(report: dict[str, Any], path: Path) -> None:
    """GAUC per micro-batch over event time, one line per strategy (PNG, written atomically)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    ends = np.array(report["micro_batches"]["last_ts"], dtype="datetime64[ms]")
    figure, axes = plt.subplots(figsize=(10, 5))
    for name, s in report["strategies"].items():
        gaucs = np.array([math.nan if v is None else v for v in s["series"]["gauc"]], dtype=float)
        axes.plot(ends, gaucs, label=f"{name} ({_fmt(s['gauc'])})", linewidth=1.2)
    axes.set_xlabel("event time (end of micro-batch)")
    axes.set_ylabel("GAUC, scored before training")
    axes.set_title(f"Prequential GAUC per micro-batch: {Path(report['dataset']['source']).name}")
    axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(axes.xaxis.get_major_locator()))
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=120)
    plt.close(figure)
    write_atomic(path, png.getvalue())
