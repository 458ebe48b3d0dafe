"""Serving: export snapshots for Paddle Inference, score candidates, serve over HTTP.

`export_snapshot` writes a version's export (a Paddle Inference model, its id tables and
``contract.json``); `ExportedModel` scores `Candidate` items with one export, and
`Scorer` with whichever version the serving pointer names, swapping versions as they are
promoted. `build_app` is the HTTP app of ``streamrec serve``.
"""

from __future__ import annotations

from streamrec.lazy import lazy_exports
from streamrec.paddlesignals import guard_paddle_import

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads either)
if TYPE_CHECKING:
    from streamrec.serving.export import export_snapshot
    from streamrec.serving.features import Candidate
    from streamrec.serving.http import build_app
    from streamrec.serving.scorer import ExportedModel, Scorer

__all__ = ["Candidate", "ExportedModel", "Scorer", "build_app", "export_snapshot"]

# Its modules import Paddle: a program's signal handlers and root logger are kept through that import.
guard_paddle_import()

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "streamrec.serving.export": ["export_snapshot"],
        "streamrec.serving.http": ["build_app"],
        "streamrec.serving.features": ["Candidate"],
        "streamrec.serving.scorer": ["ExportedModel", "Scorer"],
    },
)
