"""A count said with its noun in the right number, for every count a message or a command prints."""

from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None, *, grouped: bool = False) -> str:
    """``1 event``, ``2 events``; ``nouns`` for an irregular plural, ``grouped`` for ``12,345``.

    Examples:
        >>> plural(1, "event"), plural(2000, "event"), plural(0, "micro-batch", "micro-batches")
        ('1 event', '2000 events', '0 micro-batches')
    """
    number = f"{count:,}" if grouped else str(count)
    return f"{number} {noun if count == 1 else nouns or noun + 's'}"
