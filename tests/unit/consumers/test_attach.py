"""Attaching to the store at start: a store never reached is waited for its connect timeout,
counted from the first try, and a stop ends the wait; an outage right after the attach is
waited out as one during it.
"""

from __future__ import annotations

import threading
import time

import pytest

from streamrec.consumers.native_runner import attach_store
from streamrec.errors import FeatureStoreUnavailable, FeatureStoreUnreachable, OutageError
from streamrec.featurestore import MemoryFeatureStore


class Unreachable(MemoryFeatureStore):
    """A store each of whose connection attempts takes ``connect_s`` and fails."""

    def __init__(self, connect_s: float) -> None:
        super().__init__(3)
        self.connect_s = connect_s
        self.tries = 0

    def attach(self, can_start_empty: bool) -> None:
        self.tries += 1
        time.sleep(self.connect_s)
        raise FeatureStoreUnreachable("redis at redis://x did not answer")


def test_the_connect_timeout_counts_from_the_first_try() -> None:
    """A host that drops packets takes a whole connect timeout a try: counting from the first
    failure instead of the first try waited twice the timeout.
    """
    store, started = Unreachable(connect_s=1.0), time.monotonic()
    with pytest.raises(FeatureStoreUnreachable, match="waited 2 s"):
        attach_store(store, True, deadline_s=300, connect_timeout_s=2.0)
    assert time.monotonic() - started < 3.2 and store.tries == 2


def test_a_stop_ends_the_wait_for_a_store() -> None:
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert attach_store(Unreachable(connect_s=0.1), True, 300, 60, stop) is False
    assert time.monotonic() - started < 2


class FrozenAfterAttach(MemoryFeatureStore):
    """A store that answers the attach, then is unavailable for its next ``outages`` calls."""

    def __init__(self, outages: int) -> None:
        super().__init__(3)
        self.outages = outages

    def events_topic(self, topic_id: str | None) -> str:
        if self.outages:
            self.outages -= 1
            raise FeatureStoreUnavailable("redis unavailable: Timeout reading from 127.0.0.1:6380")
        return super().events_topic(topic_id)


def test_an_outage_between_the_attach_and_the_first_batch_is_waited_out() -> None:
    """Redis answered the attach, then froze before the events topic was adopted: found from
    outside (the consumer exited with ``redis unavailable`` where a batch would have been
    retried). The start-up's own wait now covers what follows the attach too.
    """
    store = FrozenAfterAttach(outages=2)
    endings: list[str] = []
    assert attach_store(store, True, 300, 2.0, then=lambda: endings.append(store.events_topic("t1")))
    assert endings == [""] and store.outages == 0


def test_an_outage_after_the_attach_past_the_deadline_gives_up() -> None:
    store = FrozenAfterAttach(outages=1000)
    with pytest.raises(OutageError, match="gave up after 1 s") as caught:
        attach_store(store, True, 1.0, 2.0, then=lambda: store.events_topic("t1"))
    # what to do next, in the line itself (noted by the faults tour: it named none)
    assert str(caught.value).endswith(
        "; start the consumers again once it answers: the unfinished batch is redone "
        "(STREAMREC_CONSUMER__RETRY_DEADLINE_S waits longer)"
    )


def test_another_events_topic_than_the_stores_is_not_called_the_same_one_created_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found by a tour: a store pointed at a differently named events topic warned that "the
    events topic was created again"; the store keeps topic ids, not names, so it cannot tell
    which, and the warning now says either.
    """
    store = MemoryFeatureStore(3)
    assert store.events_topic("id-1") == ""
    with caplog.at_level("WARNING", "streamrec.featurestore.base"):
        assert store.events_topic("id-2") == "@2"
    said = caplog.records[-1].getMessage()
    assert "not the one the feature store last read" in said and "another topic" in said, said
