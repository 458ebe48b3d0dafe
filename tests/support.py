"""Helpers shared by test modules (fixtures live in the conftest files)."""

from __future__ import annotations

from typing import Any


def small_tables(
    item_rows: int = 2**14, category_rows: int = 2**12, dim: int = 16, **table: Any
) -> list[dict[str, Any]]:
    """Item and category embedding tables small enough for quick tests (``ModelConfig.tables``);
    ``table`` sets more fields of both (``ids="hashed"``, ``min_count``...)."""
    return [
        {"name": "item", "feature": "item", "rows": item_rows, "dim": dim, **table},
        {"name": "category", "feature": "category", "rows": category_rows, "dim": dim, **table},
    ]
