"""What every configuration section shares: frozen, and unknown settings refused."""

from __future__ import annotations

from pydantic import ConfigDict

SECTION = ConfigDict(frozen=True, extra="forbid")
