"""Feature ablation: what each declared feature is worth, on the very same samples.

``streamrec replay backtest DATA --ablate all`` runs the chosen strategies once more per
declared extra feature, with that feature removed from the samples every strategy already
ran on (`strip`: from each sample's ``features`` and ``seq_features``) and from the
schema its learner is made under (`without`). Nothing else changes: the same events, negatives,
micro-batches and seed, so a difference in GAUC is the feature's doing.

Report (``ablation`` beside ``strategies``)::

    ablation   features[]                           (the features removed, one at a time)
               strategies.<name>  with     {auc, gauc, auc_first_q, gauc_first_q}
                                  without  {<feature>: {auc, gauc, auc_first_q, gauc_first_q}}
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import msgspec

from streamrec.errors import ConfigError
from streamrec.features import FeatureSchema
from streamrec.replay.batches import MicroBatch
from streamrec.samples import Sample

#: Every declared extra feature (``--ablate all``).
ALL = "all"
#: What the ablation reports of each run: the whole run's ranking and the cold start's.
FIGURES = ("auc", "gauc", "auc_first_q", "gauc_first_q")


def ablated(requested: Sequence[str], schema: FeatureSchema) -> tuple[str, ...]:
    """The features to remove one at a time: ``requested`` names, or every extra for ``all``.

    Raises:
        ConfigError: a name is not a declared extra feature (item and category are the
            model's own, not removable), or the schema declares none.

    Examples:
        >>> from streamrec.features import FeatureSpec
        >>> schema = FeatureSchema.of([FeatureSpec(name="genres", kind="ids"), FeatureSpec(name="year")])
        >>> ablated(["all"], schema), ablated(["year"], schema)
        (('genres', 'year'), ('year',))
    """
    extras = tuple(f.name for f in schema.extras)
    if not requested:
        return ()
    if not extras:
        raise ConfigError(
            "--ablate removes declared features, and none is declared: declare them in STREAMREC_FEATURES "
            "or [[features]] in streamrec.toml (--config)"
        )
    if ALL in requested:
        return extras
    unknown = [name for name in requested if name not in extras]
    if unknown:
        raise ConfigError(
            f"--ablate: {', '.join(unknown)} not declared; the declared features: {', '.join(extras)}"
        )
    return tuple(dict.fromkeys(requested))


def without(schema: FeatureSchema, names: Collection[str]) -> FeatureSchema:
    """``schema`` with the extra features ``names`` removed, the rest in order."""
    return FeatureSchema.of(f for f in schema.extras if f.name not in names)


def strip(sample: Sample, names: Collection[str]) -> Sample:
    """``sample`` without the values of the features ``names`` (the same object if it has none).

    Examples:
        >>> s = Sample("e1", "u1", 1_700_000_000_000, "i1", "c1", 1, ("i0",), ("c0",),
        ...            features={"year": 1995.0, "device": "ios"}, seq_features={"year": (1990.0,)})
        >>> stripped = strip(s, {"year"})
        >>> stripped.features, stripped.seq_features
        ({'device': 'ios'}, {})
        >>> strip(s, {"genres"}) is s
        True
    """
    if not any(n in sample.features or n in sample.seq_features for n in names):
        return sample
    return msgspec.structs.replace(
        sample,
        features={k: v for k, v in sample.features.items() if k not in names},
        seq_features={k: v for k, v in sample.seq_features.items() if k not in names},
    )


def strip_batches(batches: Sequence[MicroBatch], names: Collection[str]) -> list[MicroBatch]:
    """The same micro-batches, every sample without the features ``names``."""
    return [MicroBatch(b.index, [strip(s, names) for s in b.samples]) for b in batches]


def figures(summary: Mapping[str, Any]) -> dict[str, float]:
    """The ablation's figures of one strategy's summary (`streamrec.replay.report.summarise`)."""
    return {k: summary[k] for k in FIGURES}


def section(
    names: Sequence[str],
    full: Mapping[str, Mapping[str, Any]],
    reduced: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> dict[str, Any]:
    """The report's ``ablation`` section.

    Args:
        names: The features removed, in order.
        full: Each strategy's summary with every feature.
        reduced: Per removed feature, each strategy's summary without it.
    """
    return {
        "features": list(names),
        "strategies": {
            strategy: {
                "with": figures(summary),
                "without": {name: figures(reduced[name][strategy]) for name in names},
            }
            for strategy, summary in full.items()
        },
    }


def table(report: Mapping[str, Any]) -> str:
    """The ablation as markdown: per strategy, GAUC and first-quarter GAUC with and without each feature.

    Empty when the report has no ablation.
    """
    section_ = report.get("ablation")
    if not section_:
        return ""
    names = section_["features"]
    head = [
        "strategy", "GAUC", *(f"GAUC −{n}" for n in names),
        "GAUC first 1/4", *(f"first 1/4 −{n}" for n in names),
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for strategy, s in section_["strategies"].items():
        cells = [strategy]
        for figure in ("gauc", "gauc_first_q"):
            cells.append(_fmt(s["with"][figure]))
            cells += [_delta(s["without"][n][figure], s["with"][figure]) for n in names]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _delta(value: float | None, base: float | None) -> str:
    """``0.6550 (-0.0051)``: the figure without the feature, and what removing it changed."""
    if value is None or base is None or math.isnan(value) or math.isnan(base):
        return _fmt(value)
    return f"{value:.4f} ({value - base:+.4f})"


def _fmt(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.4f}"
