"""Which negative sampler gives honest offline rankings.

Judged on a generated feed log whose impressions give true labels
(``STREAMREC_CONSUMER__LABELS=join``).

The same feed is replayed twice over: once with the join (each impression a sample labelled
by whether its click came), and once as a click-only log (impressions dropped, each click a
positive with sampled negatives) under each sampler setting. Every strategy and every match
feature scored alone is ranked by GAUC on each; the sampler whose ranking agrees best with
the join's is the one whose offline figures can be believed. Kendall's tau and Spearman's rho
compare the orders; the mean absolute GAUC gap how far the figures lie from the truth (the
orders of a handful of strategies and features often tie between samplers, so ``best`` is
the sampler with the smallest gap).

The feed's exposures decide the truth: ``--feed-category-share`` of a page's other items
come from the categories of the user's own earlier events, ``--feed-history-share`` are
re-shows of the user's earlier items, the rest uniform over the catalogue (the generator's
old behaviour, 0 and 0).

    .venv/bin/python bench/sampler_agreement.py [--feed-category-share 0.5 --feed-history-share 0.1]
        [--samplers 0:0,0.5:0,0:0.1,0.5:0.1] [--strategies popularity,item-rate,features,finetune]

A sampler setting is ``category_share:history_share``. With the DIN (``finetune``) the
default feed takes a few minutes on 2 shared cores; without it, seconds. Prints one JSON
object as its last line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import numpy as np

from streamrec.config import StreamrecConfig
from streamrec.datasets.feed import IMPRESSION, FeedSpec, generate_feed
from streamrec.datasets.synthetic import ClickStreamSpec
from streamrec.events import Event
from streamrec.replay.batches import MicroBatch, build_samples, by_interval
from streamrec.replay.report import summarise, tells
from streamrec.replay.strategies import Strategy, run_strategy

MIN = 60_000


def settings(labels: str, category: float, history: float, seed: int) -> StreamrecConfig:
    """The consumer settings of one replay.

    The feed's 10-minute label window and 5 minutes of allowed lateness (`FeedSpec`'s),
    the sampler's shares, the seed.
    """
    cfg = StreamrecConfig()
    consumer = cfg.consumer.model_copy(update={
        "labels": labels, "label_window_ms": 10 * MIN, "allowed_lateness_ms": 5 * MIN, "seed": seed,
        "negative_category_share": category, "negative_history_share": history,
    })
    return cfg.model_copy(update={"consumer": consumer, "model": cfg.model.model_copy(update={"seed": seed})})


def figures(events: list[Event], cfg: StreamrecConfig, kinds: list[str], interval_ms: int) -> dict[str, Any]:
    """GAUC of every strategy and of every match feature alone, and the tells' AUCs."""
    batches: list[MicroBatch] = by_interval(build_samples(events, cfg), interval_ms)
    gaucs: dict[str, float] = {}
    for kind in kinds:
        run = run_strategy(Strategy(kind, kind, cfg.model), batches)  # type: ignore[arg-type]  # checked by Strategy
        gaucs[kind] = summarise(run, batches)["gauc"]
    alone = tells(batches)
    gaucs |= {f"{name} alone": t["gauc"] for name, t in alone.items()}
    samples = [s for b in batches for s in b.samples]
    return {
        "samples": len(samples),
        "positive_rate": float(np.mean([s.label for s in samples])),
        "gauc": gaucs,
        "tell_auc": {name: t["auc"] for name, t in alone.items()},
    }


def _ranks(values: np.ndarray) -> np.ndarray:
    order = values.argsort(kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=np.float64)
    for v in np.unique(values):  # ties share their mean rank
        ranks[values == v] = ranks[values == v].mean()
    return ranks


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b of two score vectors (ties allowed)."""
    i, j = np.triu_indices(len(a), 1)
    da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    denominator = math.sqrt(np.count_nonzero(da) * np.count_nonzero(db))
    return float((da * db).sum() / denominator) if denominator else math.nan


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho: the correlation of the ranks."""
    ra, rb = _ranks(a), _ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def agreement(truth: dict[str, float], other: dict[str, float]) -> dict[str, float]:
    """How far ``other``'s GAUCs rank (and lie) as ``truth``'s, over the names both score."""
    names = [n for n in truth if not (math.isnan(truth[n]) or math.isnan(other.get(n, math.nan)))]
    a, b = np.array([truth[n] for n in names]), np.array([other[n] for n in names])
    return {
        "kendall_tau": kendall_tau(a, b),
        "spearman": spearman(a, b),
        "mean_abs_gauc_gap": float(np.abs(a - b).mean()),
    }


def _pairs(text: str) -> list[tuple[float, float]]:
    return [(float(c), float(h)) for c, h in (part.split(":") for part in text.split(","))]


def compare(
    *,
    users: int,
    events: int,
    hours: float,
    feed: tuple[float, float],
    samplers: list[tuple[float, float]],
    kinds: list[str],
    interval_minutes: int = 30,
    seed: int = 0,
) -> dict[str, Any]:
    """The report: the join's figures and each sampler's, with its agreement.

    The feed's exposures have the shares ``feed`` (category, history); each sampler is a
    (category, history) pair.
    """
    start = time.perf_counter()
    clicks = ClickStreamSpec(users=users, events=events, duration_ms=int(hours * 3_600_000), seed=seed)
    log = generate_feed(FeedSpec(clicks=clicks, late_share=0.0, seed=seed,
                                 same_category_share=feed[0], history_share=feed[1]))
    interval = interval_minutes * MIN
    truth = figures(log.events, settings("join", 0.0, 0.0, seed), kinds, interval)
    click_log = [e for e in log.events if e.action != IMPRESSION]
    runs = {}
    for category, history in samplers:
        run = figures(click_log, settings("sampled", category, history, seed), kinds, interval)
        run["agreement"] = agreement(truth["gauc"], run["gauc"])
        runs[f"category={category:g} history={history:g}"] = run
    best = min(runs, key=lambda k: runs[k]["agreement"]["mean_abs_gauc_gap"])
    return {
        "feed": {"users": users, "behaviours": events, "events": len(log.events),
                 "category_share": feed[0], "history_share": feed[1], "seed": seed},
        "strategies": kinds,
        "join": truth,
        "samplers": runs,
        "best": best,
        "wall_seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    """Compare the samplers named on the command line; print the report as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--events", type=int, default=4_000, help="behaviours before the feed's impressions")
    parser.add_argument("--hours", type=float, default=8.0)
    parser.add_argument("--feed-category-share", type=float, default=0.5)
    parser.add_argument("--feed-history-share", type=float, default=0.1)
    parser.add_argument("--samplers", default="0:0,0.5:0,0:0.1,0.5:0.1", help="category:history shares")
    parser.add_argument("--strategies", default="popularity,item-rate,features")
    parser.add_argument("--interval-minutes", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    report = compare(
        users=args.users, events=args.events, hours=args.hours,
        feed=(args.feed_category_share, args.feed_history_share), samplers=_pairs(args.samplers),
        kinds=args.strategies.split(","), interval_minutes=args.interval_minutes, seed=args.seed,
    )
    for name, run in report["samplers"].items():
        print(name, json.dumps(run["agreement"]), file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
