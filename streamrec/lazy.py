"""Re-exports a package resolves on first use (PEP 562), so importing the package stays cheap.

A package's ``__init__`` names its public surface in ``__all__`` and imports those names for
type checkers only; at run time `lazy_exports` imports the defining module the first
time a name is read. ``import streamrec`` (and so ``streamrec --help``) therefore never pays
for Paddle, Redis or Kafka clients, and ``streamrec.learner.hashing`` does not drag in the
learner loop.
"""

from __future__ import annotations

import importlib
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `import streamrec` stays bare
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for the names ``exports`` lists per module.

    Args:
        package: The package's ``__name__``.
        exports: Per defining module (a full dotted name), the names the package re-exports.

    Returns:
        ``(__getattr__, __dir__)``, to assign at the package's top level.

    Examples:
        >>> getattr_, dir_ = lazy_exports("streamrec", {"streamrec.errors": ["StreamrecError"]})
        >>> getattr_("StreamrecError").__name__
        'StreamrecError'
        >>> "StreamrecError" in dir_()
        True
        >>> getattr_("Nothing")
        Traceback (most recent call last):
        ...
        AttributeError: module 'streamrec' has no attribute 'Nothing'
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later reads are plain attribute lookups
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
