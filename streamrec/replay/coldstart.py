"""The cold-start slices of a backtest: each strategy with and without the fallback.

"New" is the stream's (`streamrec.coldstart`): a new item was the target of no sample in an
earlier micro-batch; a new user has an empty history at the sample's time. The same for
every strategy (a static model learnt fewer samples, so more items are new to it than this
counts).

``cold_start.<slice>`` (``new_items``, ``new_users``): ``samples`` in the slice, then per
strategy ``auc`` and ``gauc`` on the slice's samples (sample-weighted means of the
per-micro-batch figures, as a strategy's), ``auc_fallback`` and ``gauc_fallback`` with the
fallback applied, and ``batch_auc``, ``batch_gauc``, ``batch_auc_fallback``,
``batch_gauc_fallback``: the same over the whole micro-batches the slice sits in, where the
fallback's scores are ranked against the model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from streamrec.coldstart import ItemPrior, new_users, with_fallback
from streamrec.learner.columns import SampleColumns
from streamrec.learner.metrics import auc, gauc
from streamrec.replay.batches import MicroBatch
from streamrec.replay.strategies import StrategyRun

SLICES = ("new_items", "new_users")


def _masks(
    batches: Sequence[MicroBatch],
) -> tuple[list[SampleColumns], list[ItemPrior], dict[str, list[np.ndarray]]]:
    """Each micro-batch's columns, the prior as it stood before it, and each slice's mask."""
    prior, columns, priors = ItemPrior(), [], []
    masks: dict[str, list[np.ndarray]] = {s: [] for s in SLICES}
    for micro in batches:
        batch = SampleColumns.from_samples(micro.samples)
        masks["new_items"].append(~prior.known(batch.target_ids("item")))
        masks["new_users"].append(new_users(batch))
        columns.append(batch)
        priors.append(prior.copy())
        prior.learn_batch(batch)
    return columns, priors, masks


def _figures(
    columns: list[SampleColumns], scores: list[np.ndarray], masks: list[np.ndarray]
) -> dict[str, float]:
    slice_auc, slice_gauc, slice_n, batch_auc, batch_gauc, batch_n = [], [], [], [], [], []
    for c, s, m in zip(columns, scores, masks, strict=True):
        if not m.any():
            continue
        slice_auc.append(auc(c.label[m], s[m]))
        slice_gauc.append(gauc(c.label[m], s[m], c.user_ids[m]))
        slice_n.append(int(m.sum()))
        batch_auc.append(auc(c.label, s))
        batch_gauc.append(gauc(c.label, s, c.user_ids))
        batch_n.append(len(c))
    return {
        "auc": _mean(slice_auc, slice_n),
        "gauc": _mean(slice_gauc, slice_n),
        "batch_auc": _mean(batch_auc, batch_n),
        "batch_gauc": _mean(batch_gauc, batch_n),
    }


def _mean(values: list[float], weights: list[int]) -> float:
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if not np.isnan(v)]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else float("nan")


def cold_start(runs: Sequence[StrategyRun], batches: Sequence[MicroBatch]) -> dict[str, Any]:
    """The ``cold_start`` section of the report (see the module docstring)."""
    columns, priors, masks = _masks(batches)
    out: dict[str, Any] = {}
    for name in SLICES:
        section: dict[str, Any] = {"samples": int(sum(int(m.sum()) for m in masks[name]))}
        flags = {"items": name == "new_items", "users": name == "new_users"}
        for run in runs:
            fallen = [
                with_fallback(s, c, p, **flags) for s, c, p in zip(run.scores, columns, priors, strict=True)
            ]
            model = _figures(columns, run.scores, masks[name])
            fallback = _figures(columns, fallen, masks[name])
            section[run.name] = {**model, **{f"{k}_fallback": v for k, v in fallback.items()}}
        out[name] = section
    return out
