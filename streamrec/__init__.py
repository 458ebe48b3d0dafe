"""streamrec: a real-time incremental recommendation learner.

Click events flow through Kafka into per-user behaviour sequences held in Redis; point-in-time
training samples feed a DIN model in PaddlePaddle that learns in micro-batches and writes
versioned snapshots.

The top level names the settings, the two wire contracts and the error root; each part has
its own package: `streamrec.learner` (the model, the learner loop, snapshots),
`streamrec.consumers`, `streamrec.featurestore`, `streamrec.kafka`,
`streamrec.serving`, `streamrec.replay` and `streamrec.datasets`. Names are
imported when first used, so ``import streamrec`` stays fast.

Examples:
    >>> import streamrec
    >>> streamrec.Event("e1", "u1", "i1", "c1", "click", 1_700_000_000_000).to_json()
    b'{"event_id":"e1","user_id":"u1","item_id":"i1","category_id":"c1","action":"click","ts":1700000000000}'
"""

from __future__ import annotations

from streamrec.lazy import lazy_exports

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads either)
if TYPE_CHECKING:
    from streamrec.config import StreamrecConfig, load_config
    from streamrec.errors import StreamrecError
    from streamrec.events import Event
    from streamrec.samples import Sample

__version__ = "0.1.0"

__all__ = ["Event", "Sample", "StreamrecConfig", "StreamrecError", "__version__", "load_config"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "streamrec.config": ["StreamrecConfig", "load_config"],
        "streamrec.errors": ["StreamrecError"],
        "streamrec.events": ["Event"],
        "streamrec.samples": ["Sample"],
    },
)
