"""One ``with``-block idiom for the objects that hold resources until ``close()``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class Closing(ABC):
    """A resource usable in a ``with`` block.

    The block gives the object and ends with `close`, whatever happened in it.
    """

    @abstractmethod
    def close(self) -> None:
        """Release what the object holds; safe to call more than once."""

    def __enter__(self) -> Self:
        """The object itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the object."""
        self.close()
