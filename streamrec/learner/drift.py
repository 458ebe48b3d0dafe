"""The features the samples carry against those the learner declares.

The consumers and the learner read their settings each on their own (a ``streamrec.toml`` in
each one's working directory, ``STREAMREC_FEATURES`` in each one's environment). A feature
declared in one and not the other breaks nothing in a sample, and the model loses it without a
word: carried but not declared by the learner, it is never trained on; declared by the learner
but not by the consumers, every sample reads its default. Found from outside: the MovieLens
example's five features declared to the learner alone trained 3,000 samples with none of them.

`FeatureDrift` warns of each such feature once a run, naming it and what to set.
"""

from __future__ import annotations

import logging

import numpy as np

from streamrec.features.schema import BUILTIN, FeatureSchema
from streamrec.learner.columns import FeatureColumn, Jagged, SampleColumns

logger = logging.getLogger(__name__)

#: A declared feature in none of this many samples since the start is named: one a stream
#: merely sends rarely may take that long to turn up, one the consumers do not declare never does.
ABSENT_AFTER = 1_000

_BUILTIN = frozenset(f.name for f in BUILTIN)


class FeatureDrift:
    """Warns, once a run for each, of the features the samples and the learner's schema disagree on.

    Examples:
        >>> from streamrec.features import FeatureSpec
        >>> from streamrec.samples import Sample
        >>> drift = FeatureDrift(FeatureSchema.of([FeatureSpec(name="tier", role="user")]), absent_after=2)
        >>> batch = SampleColumns.from_samples([
        ...     Sample("e1", "u1", 1, "i1", "c1", 1, (), (), features={"device": "ios"}),
        ...     Sample("e2", "u2", 2, "i2", "c2", 0, (), ()),
        ... ])
        >>> drift.observe(batch)
        (('device',), ('tier',))
        >>> drift.observe(batch)  # each named once
        ((), ())
    """

    def __init__(self, schema: FeatureSchema, absent_after: int = ABSENT_AFTER) -> None:
        """Compare the samples with ``schema``'s declared features."""
        self._declared = frozenset(f.name for f in schema.extras)
        self._absent_after = absent_after
        self._seen: set[str] = set()  # the declared features some sample carried
        self._named: set[str] = set()  # the features warned of
        self._samples = 0

    def observe(self, batch: SampleColumns) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Warn of what ``batch`` shows for the first time; return what it named.

        Returns:
            The features carried that the learner does not declare, and the declared ones no
            sample has carried in the first ``absent_after`` samples, each named for the first time.
        """
        carried = batch.features.keys() - _BUILTIN
        undeclared = tuple(sorted(carried - self._declared - self._named))
        for name in undeclared:
            logger.warning(
                "the samples carry feature %r, which this learner does not declare: it is not trained "
                "on. Declare it to the learner as the consumers do (STREAMREC_FEATURES, or [[features]] "
                "in its streamrec.toml), or stop declaring it to the consumers", name,
            )
        self._seen |= {n for n in (carried & self._declared) - self._seen if _has_value(batch.features[n])}
        self._samples += len(batch)
        absent: tuple[str, ...] = ()
        if self._samples >= self._absent_after:
            absent = tuple(sorted(self._declared - self._seen - self._named))
            for name in absent:
                logger.warning(
                    "feature %r, declared to this learner, has a value in none of the %d samples trained "
                    "since it started: every one reads its default. Declare it to the consumers too "
                    "(STREAMREC_FEATURES, or [[features]] in their streamrec.toml), and check that the "
                    "events carry its field (its name, or its `field`, as the events spell it); a feature "
                    "the events merely carry rarely may take longer to show", name, self._samples,
                )
        self._named.update(undeclared, absent)
        return undeclared, absent


def _has_value(column: FeatureColumn) -> bool:
    """Whether any sample of ``column`` has a value.

    Consumers declaring a feature the events lack (a misspelt name or field) put it in every
    sample, null throughout.
    """
    for side in (column.target, column.sequence):
        if isinstance(side, Jagged):
            if len(side.values):
                return True
        elif isinstance(side, np.ndarray):
            if not np.isnan(side).all():
                return True
        elif side is not None and any(side):
            return True
    return False
