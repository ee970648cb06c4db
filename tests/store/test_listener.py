"""The store's notifications (``Store.notifications()``), on both engines: one object per
store; what is sent reaches the callbacks subscribed in this process, and an event message
the run's followers. On PostgreSQL the message travels the installation's channel through
the store's own LISTEN connection (so another process's NOTIFY arrives too); on SQLite it
is delivered in this process, and ``listen`` has nothing to hear."""

from __future__ import annotations

import anyio
import asyncpg
import pytest
from conformance_support import store
from conftest import PG_URL
from factories import StoreHandle, engine_ready, handle
from helpers import wait_for

from runq.store.base import Store
from runq.store.notifications import MessageKind, Notifications, parse_message

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle", "store"]  # fixtures used by name


async def test_one_notifications_object_per_store_and_what_it_reaches(
    handle: StoreHandle, store: Store
) -> None:
    notifications = store.notifications()
    assert store.notifications() is notifications
    assert notifications.crosses_processes is (handle.engine == "postgres")


async def test_a_sent_message_reaches_the_subscribers_and_the_followers(store: Store) -> None:
    notifications = store.notifications()
    woken: list[str] = []
    cancelled: list[str] = []
    notifications.subscribe(lambda: woken.append("wake"), cancelled.append)
    followed = anyio.Event()

    async def follower() -> None:
        await notifications.events.changed("r2", timeout=30)
        followed.set()

    async with anyio.create_task_group() as tg:
        await tg.start(notifications.listen)
        tg.start_soon(follower)
        await anyio.wait_all_tasks_blocked()  # the follower waits on the feed
        await notifications.send("wake")
        await notifications.send("cancel:r1")
        await notifications.send("event:r2:3")
        await wait_for(lambda: woken == ["wake"], timeout=10, message="the wake-up arrives")
        await wait_for(lambda: cancelled == ["r1"], timeout=10, message="the cancel arrives")
        with anyio.fail_after(10):
            await followed.wait()
        tg.cancel_scope.cancel()
    assert not notifications.listening


async def test_postgres_hears_another_connections_notify(handle: StoreHandle, store: Store) -> None:
    if handle.engine != "postgres":
        pytest.skip("only PostgreSQL has a channel between processes")
    notifications = store.notifications()
    woken: list[str] = []
    notifications.subscribe(lambda: woken.append("wake"), lambda _run_id: None)
    async with anyio.create_task_group() as tg:
        await tg.start(notifications.listen)
        assert notifications.listening
        con = await asyncpg.connect(PG_URL)
        try:
            await con.execute("SELECT pg_notify($1, 'wake')", f"runq_{handle.schema}")
        finally:
            await con.close()
        await wait_for(lambda: woken == ["wake"], timeout=10, message="the NOTIFY arrives")
        tg.cancel_scope.cancel()


def test_messages() -> None:
    assert parse_message("wake") == (MessageKind.WAKE, None)
    assert parse_message("cancel:abc") == (MessageKind.CANCEL, "abc")
    assert parse_message("cancel:") == (MessageKind.UNKNOWN, None)
    assert parse_message("event:abc:7") == (MessageKind.EVENT, "abc")
    assert parse_message("event:7") == (MessageKind.UNKNOWN, None)
    assert parse_message("hello") == (MessageKind.UNKNOWN, None)


def test_in_process_notifications_reach_subscribers_until_they_leave() -> None:
    notifications = Notifications()
    woken: list[str] = []
    unsubscribe = notifications.subscribe(
        lambda: woken.append("wake"), lambda rid: woken.append(rid)
    )
    notifications.wake_here()
    notifications.cancel_here("r1")
    notifications.deliver("wake")
    notifications.deliver("cancel:r2")
    unsubscribe()
    notifications.wake_here()
    assert woken == ["wake", "r1", "wake", "r2"]


async def test_an_event_message_wakes_the_followers_of_its_run_only() -> None:
    notifications = Notifications()
    seen: list[str] = []
    notifications.events.watch_all(seen.append)
    woken = anyio.Event()

    async def follower() -> None:
        await notifications.events.changed("r1", timeout=10)
        woken.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(follower)
        await anyio.wait_all_tasks_blocked()
        notifications.deliver("event:r2:1")
        await anyio.wait_all_tasks_blocked()
        assert not woken.is_set()
        await notifications.send("event:r1:4")  # in-process: delivered at once
        with anyio.fail_after(5):
            await woken.wait()
    assert seen == ["r2", "r1"]
