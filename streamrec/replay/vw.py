"""The optional ``vw`` baseline: Vowpal Wabbit as an online linear learner on the same samples.

What the DIN adds over a linear model with pairwise interactions of the same inputs (the
user, the target's item and category, the history's items and categories) and the causal
match features (`streamrec.learner.match`), learnt in one online pass: the backtester
scores each micro-batch, then VW learns it, sample after sample in time order.

Needs the ``vw`` extra (``pip install 'streamrec[vw]'``); nothing else imports this module's
learner, so streamrec runs without it. Examples are VW's text format, one a sample; ids are
percent-escaped (`vw_token`), since ``|``, ``:`` and whitespace separate its fields.
"""

from __future__ import annotations

import functools
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from streamrec.errors import ConfigError
from streamrec.learner.base import TrainResult
from streamrec.learner.columns import SampleColumns
from streamrec.learner.hashing import fingerprint
from streamrec.learner.match import match_features

EXTRA = "pip install 'streamrec[vw]'"

#: Each input's namespace: VW names a namespace by its first letter in ``-q``/``--interactions``.
NAMESPACES: dict[str, str] = {
    "user": "u",
    "item": "i",
    "category": "c",
    "history_items": "h",
    "history_categories": "g",
    "features": "f",
}
#: Every pair of the five id namespaces but history x history (2,500 features a sample at
#: T=50: cost, not signal). Target x history (c x g: "this user browses this category") is
#: what ids alone cannot say; on Taobao these nine scored GAUC 0.838 against 0.830 for the
#: six target-history and user-target pairs (2^22 weights).
INTERACTIONS = ("ui", "uc", "uh", "ug", "ic", "ih", "ig", "ch", "cg")
# 2^24 weights (256 MB with VW's adaptive, normalised updates; allocated as touched): at
# VW's default 2^18, and still at 2^22 (0.830 against 0.836 on Taobao), items x history
# items collide (55,000 items there).
BITS = 24
# VW's default learning rate; its updates are already adaptive and normalised per feature.
LEARNING_RATE = 0.5

# What VW reads as a separator (``|``, ``:``, whitespace) and the escape character itself.
_SPECIAL = re.compile(r"[%|:\s]")


@functools.lru_cache(maxsize=1 << 20)
def vw_token(raw: str) -> str:
    """``raw`` as one VW feature name.

    ``%``, ``|``, ``:`` and whitespace are percent-escaped (as in a URL), so distinct ids stay
    distinct and none splits the example.
    """
    return _SPECIAL.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), raw)


def examples(batch: SampleColumns, labelled: bool) -> list[str]:
    """One VW example line per sample of ``batch``; the label (1 or -1) only if ``labelled``."""
    ns = NAMESPACES
    features = match_features(batch)
    names = list(features)
    values = np.column_stack([features[n] for n in names]) if len(batch) else np.zeros((0, len(names)))
    ends = np.cumsum(batch.seq_lengths).tolist()
    users = batch.user_ids.tolist()
    items, categories = batch.target_ids("item"), batch.target_ids("category")
    seq_items, seq_categories = batch.sequence_ids("item"), batch.sequence_ids("category")
    lines = []
    start = 0
    for k, end in enumerate(ends):
        label = ("1 " if batch.label[k] > 0 else "-1 ") if labelled else ""
        history = " ".join(vw_token(i) for i in seq_items[start:end])
        history_categories = " ".join(vw_token(c) for c in seq_categories[start:end])
        matched = " ".join(f"{n}:{v:.6g}" for n, v in zip(names, values[k].tolist(), strict=True))
        lines.append(
            f"{label}|{ns['user']} {vw_token(users[k])} |{ns['item']} {vw_token(items[k])}"
            f" |{ns['category']} {vw_token(categories[k])} |{ns['history_items']} {history}"
            f" |{ns['history_categories']} {history_categories} |{ns['features']} {matched}"
        )
        start = end
    return lines


def require_vw() -> Any:
    """The ``vowpalwabbit`` module, or a one-line `ConfigError` naming the extra."""
    try:
        import vowpalwabbit
    except ImportError as exc:
        raise ConfigError(f"the vw strategy needs the vowpalwabbit package: {EXTRA}") from exc
    return vowpalwabbit


def _workspace(args: str) -> Any:
    return require_vw().Workspace(args)


class VWLearner:
    """Online logistic regression in Vowpal Wabbit, one pass in sample order.

    See the module docstring. The constructor's arguments are VW's settings.
    """

    def __init__(
        self,
        interactions: tuple[str, ...] = INTERACTIONS,
        bits: int = BITS,
        learning_rate: float = LEARNING_RATE,
    ) -> None:
        """Start with every weight at zero (every score 0.5)."""
        self.interactions = interactions
        self.bits = bits
        self.learning_rate = learning_rate
        self._ws = _workspace(self._args())
        # Items by their fingerprint, as the baselines and the model's id maps key them, so
        # the state is numbers a snapshot (safetensors) stores.
        self._known: set[int] = set()

    def _args(self) -> str:
        pairs = " ".join(f"-q {p}" for p in self.interactions)
        return (
            f"--quiet --loss_function logistic --link logistic --hash all -b {self.bits} "
            f"-l {self.learning_rate:g} {pairs}"
        )

    def predict_many(self, batch: SampleColumns) -> np.ndarray:
        """See `Learner`.

        Scoring changes nothing: each example is built on its own (``Example(workspace, line)``)
        and never finished, since finishing one counts it in counters the model file keeps; an
        example built so is freed with its Python object (one parsed by the workspace and not
        finished leaked ~32 KB).
        """
        vw = require_vw()
        lines = examples(batch, labelled=False)
        scores = (self._ws.predict(vw.Example(self._ws, line)) for line in lines)
        return np.fromiter(scores, dtype=np.float64, count=len(lines))

    def learn_many(self, batch: SampleColumns) -> TrainResult:
        """One online update per sample, in sample order.

        No loss is reported: VW's own progressive loss would cost a second scoring of every
        sample.
        """
        for line in examples(batch, labelled=True):
            self._ws.learn(line)
        self._known.update(fingerprint(batch.target_ids("item")).tolist())
        self._known.update(fingerprint(batch.sequence_ids("item")).tolist())
        return TrainResult(steps=len(batch))

    def is_known(self, batch: SampleColumns) -> np.ndarray:
        """Bool [B]: whether each target item was in a sample learnt before."""
        keys = fingerprint(batch.target_ids("item")).tolist()
        return np.fromiter((i in self._known for i in keys), dtype=bool, count=len(batch))

    def state_arrays(self) -> dict[str, np.ndarray]:
        """VW's own model file as bytes, and the items known."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.vw"
            self._ws.save(str(path))
            weights = np.frombuffer(path.read_bytes(), dtype=np.uint8).copy()
        return {"model/vw": weights, "state/known_items": np.array(sorted(self._known), dtype=np.uint64)}

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """See `Learner`.

        The model file is loaded with this learner's own arguments besides ``-i``: with ``-i``
        alone VW drops settings the file does not keep, and a resumed model scored up to 0.46
        away from the original after more learning. ``--preserve_performance_counters``: VW
        zeroes the counters a model file keeps (examples and labels seen, loss) when it loads
        one, so the restored model's file would differ from the original's.
        """
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.vw"
            path.write_bytes(np.asarray(arrays["model/vw"], dtype=np.uint8).tobytes())
            self._ws = _workspace(f"{self._args()} --preserve_performance_counters -i {path}")
        self._known = set(arrays["state/known_items"].tolist())
