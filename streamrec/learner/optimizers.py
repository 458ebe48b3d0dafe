"""Paddle optimizers made free of the reference cycle each one is built with.

``paddle.optimizer.Optimizer.__init__`` stores ``self.clear_gradients = self.clear_grad``: a
bound method of itself on the instance, so every optimizer is in a reference cycle, and with it
the parameters it updates and their moments. Reference counting never frees them; only a full
collection does, and the batch loops' collector runs rarely (`streamrec.gcsettings`). A learner
built from a snapshot for each export (the gate's) so held its whole model and moments after it
was dropped: about 200 MB a snapshot in a soak of `streamrec learner run`.
"""

from __future__ import annotations

import weakref
from typing import Any


def acyclic(optimizer: Any) -> None:
    """Replace ``optimizer``'s bound ``clear_gradients`` by one that refers to it weakly."""
    ref = weakref.ref(optimizer)

    def clear_gradients(set_to_zero: bool = True) -> None:
        """Paddle's alias of ``clear_grad``, through a weak reference."""
        live = ref()
        if live is not None:
            live.clear_grad(set_to_zero)

    optimizer.clear_gradients = clear_gradients
