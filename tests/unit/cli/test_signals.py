"""Stop signals: the first lets the batch finish, a second interrupts whatever is waiting."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from streamrec.cli.common import stop_on_signals


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_stop_signal_interrupts_a_wait(restored_handlers: None, signum: signal.Signals) -> None:
    stop = stop_on_signals()
    os.kill(os.getpid(), signum)
    assert stop.wait(5)  # the first: the loop finishes its batch
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # a wait that does not look at the stop event
