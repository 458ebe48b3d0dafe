"""Helpers shared by test modules (fixtures live in the conftest files)."""

from __future__ import annotations

from typing import Any


def small_tables(
    item_buckets: int = 2**14, category_buckets: int = 2**12, dim: int = 16
) -> list[dict[str, Any]]:
    """Item and category embedding tables small enough for quick tests (``ModelConfig.tables``)."""
    return [
        {"name": "item", "feature": "item", "buckets": item_buckets, "dim": dim},
        {"name": "category", "feature": "category", "buckets": category_buckets, "dim": dim},
    ]
