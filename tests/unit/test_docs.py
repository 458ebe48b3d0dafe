"""The README and compose.yaml name only settings that exist."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from streamrec.config import StreamrecConfig

ROOT = Path(__file__).resolve().parents[2]
# Environment variables that are not settings: fault injection and the test data folder.
NOT_SETTINGS = {"STREAMREC_FAULT", "STREAMREC_FAULT_MODE", "STREAMREC_SHARED_DATA"}


def _fields(model: Any) -> dict[str, Any]:
    """Field name -> its annotation, for a settings model or a union of section models."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        return {name: f.annotation for name, f in model.model_fields.items()}
    merged: dict[str, Any] = {}
    for arm in getattr(model, "__args__", ()):  # Annotated[...] and unions of sections
        merged.update(_fields(arm))
    return merged


def _is_setting(env: str) -> bool:
    fields = _fields(StreamrecConfig)
    *sections, name = env.removeprefix("STREAMREC_").lower().split("__")
    for section in sections:
        if section not in fields:
            return False
        fields = _fields(fields[section])
    return name in fields


@pytest.mark.parametrize("doc", ["README.md", "compose.yaml"])
def test_every_documented_setting_exists(doc: str) -> None:
    names = set(re.findall(r"STREAMREC_[A-Z0-9_]+[A-Z0-9]", (ROOT / doc).read_text())) - NOT_SETTINGS
    assert names, f"{doc} names no settings"
    assert sorted(n for n in names if not _is_setting(n)) == []
