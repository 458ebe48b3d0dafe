"""What every configuration section shares: frozen, unknown settings and non-finite numbers refused.

No setting means anything by infinity or NaN (those that can be off take ``null`` or 0): an
infinite interval or poll was taken, and a learner so set never trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, ConfigDict

from streamrec.errors import EMPTY_PATH

SECTION = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _not_empty(value: object) -> object:
    if value == "":
        raise ValueError(EMPTY_PATH)
    return value


#: A path setting: ``''`` refused, where a `Path` would read it as ``.``, the working directory
#: (``STREAMREC_LEARNER__SNAPSHOT_DIR=`` in a script listed the working directory's snapshots).
NonEmptyPath = Annotated[Path, BeforeValidator(_not_empty)]


def _group_id(value: str) -> str:
    if not value.strip():
        raise ValueError(f"{value!r} is no Kafka consumer group id: name the group")
    return value


#: A consumer group's id: an empty one made confluent_kafka's consumer abort the process (exit 134).
GroupId = Annotated[str, AfterValidator(_group_id)]


#: The longest duration in seconds any setting takes: a century, far past any real one. Beyond
#: it the clocks the settings reach refuse it: a socket or thread wait takes at most 2^63 ns
#: (~292 years; ``STREAMREC_STORE__CONNECT_TIMEOUT_S=1e300`` was an ``OverflowError``
#: traceback), and Redis an expiry within 2^63 ms of the epoch, written by the store's scripts
#: in full (``STREAMREC_STORE__TTL_S=1e16`` failed the consumers' first batch in Redis).
MAX_SECONDS = 100 * 365 * 86_400
