"""Stop signals: the first lets the batch finish, a second interrupts whatever is waiting."""

from __future__ import annotations

import os
import signal
import threading
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


@pytest.mark.parametrize("restart_calls", [True, False])
def test_a_stop_signal_to_a_rank_waiting_on_the_tcp_store_lets_the_wait_finish(
    restored_handlers: None, restart_calls: bool
) -> None:
    """Found in CI: a rank stopped while it waited in `RankGroup.meet` (a read from Paddle's TCP
    store) failed with "TCP receive error. Details: Interrupted system call" (Paddle does not
    retry a read a signal interrupts), left the group, and the other rank's exchange then failed:
    a clean stop of ``learner run --workers 2`` ended in errors. A rank's stop handlers restart
    an interrupted call (SA_RESTART), so the read waits on; ``False`` shows Paddle's failure.
    """
    from paddle.base import core

    from streamrec.local.ports import free_ports

    port = free_ports("127.0.0.1", 1)[0]
    master = core.TCPStore("127.0.0.1", port, True, 1, 30)
    stop = stop_on_signals(restart_calls=restart_calls)
    main = threading.get_ident()

    def later() -> None:
        time.sleep(0.3)
        signal.pthread_kill(main, signal.SIGTERM)  # to the thread blocked in the read
        time.sleep(0.3)
        master.set("later", "1")

    threading.Thread(target=later, daemon=True).start()
    client = core.TCPStore("127.0.0.1", port, False, 1, 30)
    if restart_calls:
        assert client.get("later") == b"1" and stop.is_set()
    else:
        with pytest.raises(ValueError, match="Interrupted system call"):
            client.get("later")


def test_a_second_stop_signal_interrupts_a_wait_with_calls_restarted(restored_handlers: None) -> None:
    stop = stop_on_signals(restart_calls=True)
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.wait(5)
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # a wait the kernel never restarts: the handler runs
