"""What every configuration section shares: frozen, unknown settings and non-finite numbers refused.

No setting means anything by infinity or NaN (those that can be off take ``null`` or 0): an
infinite interval or poll was taken, and a learner so set never trained.
"""

from __future__ import annotations

from pydantic import ConfigDict

SECTION = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
