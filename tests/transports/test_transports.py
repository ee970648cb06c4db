"""Routing and the wake-up transports (the coalescing notifier), without a daemon; the
store's notifications themselves are tests/store/test_listener.py."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
from helpers import wait_for

from runq.store.notifications import Notifications
from runq.transports.notifier import Notifier
from runq.transports.routing import resolve_route

pytestmark = [pytest.mark.anyio]


def test_the_most_specific_pattern_wins_and_unrouted_is_sync() -> None:
    routing = {"*": "local", "agent/*": "postgres", "agent/summarize": "sync", "task/re*": "local"}
    assert resolve_route(routing, "agent", "summarize") == "sync"
    assert resolve_route(routing, "agent", "other") == "postgres"
    assert resolve_route(routing, "task", "report") == "local"
    assert resolve_route(routing, "team", "x") == "local"
    assert resolve_route({"agent/*": "local"}, "task", "echo") == "sync"


class FakeStore(Notifications):
    """A channel whose sends are recorded, and fail on demand."""

    crosses_processes = True

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []
        self.attempts = 0
        self.fail = False

    async def send(self, payload: str) -> None:
        self.attempts += 1
        if self.fail:
            raise OSError("connection refused")
        self.sent.append(payload)


async def test_a_burst_of_wake_ups_sends_few_notifies_and_always_a_last_one() -> None:
    store = FakeStore()
    notifier = Notifier(store, window=0.05)
    async with anyio.create_task_group() as tg:
        tg.start_soon(notifier.run)
        for _ in range(500):
            notifier.request_wake()
            await anyio.lowlevel.checkpoint()
        # The first request is sent at once, the rest of the burst by one trailing NOTIFY.
        await wait_for(lambda: len(store.sent) >= 2, timeout=2, message="the trailing NOTIFY")
        assert len(store.sent) <= 3
        sent = len(store.sent)
        notifier.request_wake()
        await wait_for(lambda: len(store.sent) == sent + 1, timeout=2, message="next burst")
        tg.cancel_scope.cancel()


async def test_a_failed_notify_is_logged_and_not_raised() -> None:
    store = FakeStore()
    store.fail = True
    notifier = Notifier(store, window=0.01)
    async with anyio.create_task_group() as tg:
        tg.start_soon(notifier.run)
        notifier.request_wake()
        await wait_for(lambda: store.attempts == 1, timeout=2, message="a NOTIFY is tried")
        store.fail = False
        notifier.request_wake()
        await wait_for(lambda: store.sent == ["wake"], timeout=2, message="recovers")
        tg.cancel_scope.cancel()


def test_a_lone_producer_carries_every_wake_up_in_its_own_statement() -> None:
    """Back-to-back submits, one at a time, each get the inline slot even inside one
    coalescing window: a fallback NOTIFY after the commit would only add latency."""
    notifier = Notifier(FakeStore(), window=60)
    for _ in range(3):
        assert notifier.take_inline_slot()
        notifier.inline_done()


def test_concurrent_submissions_share_one_inline_wake_up_per_window() -> None:
    """While one submission carries a wake-up, the others inside the window do not; once
    it is done, or once the window has passed, the next one may carry one again."""
    notifier = Notifier(FakeStore(), window=60)
    assert notifier.take_inline_slot()
    assert not notifier.take_inline_slot()
    assert not notifier.take_inline_slot()
    notifier.inline_done()
    assert notifier.take_inline_slot()
    short = Notifier(FakeStore(), window=0.0)
    assert short.take_inline_slot()
    assert short.take_inline_slot()  # the window passed: a second one in flight is fine
