"""The LISTEN connection during a PostgreSQL outage: retries back off, the outage is
logged once when it starts and once when it ends.

The finding: the backoff was reset on every failure (it measured "connected for" from
the last successful connect, which only grows during an outage), so each replica
retried 12 to 15 times a second and logged a warning each time. Here the listener
reaches PostgreSQL through a small TCP relay; stopping the relay leaves a refused port.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
import asyncpg
import pytest
from helpers import wait_for
from serve_harness import free_port

from runq.store.postgres.cluster import PrimaryConnector, PrimaryTracker
from runq.store.postgres.notifications import (
    KEEPALIVE_SECONDS,
    RECONNECT_MAX,
    RECONNECT_MIN,
    Listener,
)

pytestmark = [pytest.mark.anyio]

#: How long the outage is watched for attempts.
WINDOW_SECONDS = 4.0


async def _pipe(source: anyio.abc.ByteStream, sink: anyio.abc.ByteStream) -> None:
    try:
        async for chunk in source:
            await sink.send(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
    finally:
        await sink.aclose()


@asynccontextmanager
async def relay(port: int, target_host: str, target_port: int) -> AsyncIterator[None]:
    """Forward 127.0.0.1:``port`` to PostgreSQL; on exit the port refuses connections and
    every relayed connection is cut (what a database outage looks like to a client)."""

    async def handle(client: anyio.abc.SocketStream) -> None:
        upstream = await anyio.connect_tcp(target_host, target_port)
        async with client, upstream, anyio.create_task_group() as pipes:
            pipes.start_soon(_pipe, client, upstream)
            pipes.start_soon(_pipe, upstream, client)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        try:
            yield
        finally:
            tg.cancel_scope.cancel()


def _max_attempts_within(window: float) -> int:
    """Attempts possible in ``window`` with the shortest jittered delays (half of each)."""
    attempts, elapsed, delay = 0, 0.0, RECONNECT_MIN
    while elapsed + delay * 0.5 <= window:
        elapsed += delay * 0.5
        attempts += 1
        delay = min(delay * 2, RECONNECT_MAX)
    return attempts


def _events(caplog: pytest.LogCaptureFixture, event: str) -> int:
    return sum(record.getMessage() == event for record in caplog.records)


async def test_outage_finding_listen_reconnects_back_off_and_log_once(
    pg_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = urlsplit(pg_url)
    port = free_port()
    via_relay = urlunsplit(target._replace(netloc=f"{target.username}@127.0.0.1:{port}"))

    attempts = 0
    real_connect = asyncpg.connect

    async def counting_connect(*args: Any, **kwargs: Any) -> Any:
        nonlocal attempts
        attempts += 1
        return await real_connect(*args, **kwargs)

    monkeypatch.setattr(asyncpg, "connect", counting_connect)
    caplog.set_level(logging.DEBUG, logger="runq.store.postgres.notifications")
    connector = PrimaryConnector(
        via_relay, PrimaryTracker(via_relay, counts=False), application_name="runq-listener"
    )
    listener = Listener(connector, "runq_backoff_test", deliver=print)

    async with anyio.create_task_group() as tg:
        async with relay(port, target.hostname or "127.0.0.1", target.port or 5432):
            await tg.start(listener.run)
            assert listener.connected
            # A connection that held this long ends a healthy period; what follows is an
            # outage whose retries must grow from the shortest delay.
            await anyio.sleep(KEEPALIVE_SECONDS + 0.5)
        # The relay is gone: its port now refuses connections.
        await wait_for(lambda: not listener.connected, timeout=10, message="connection lost")
        before = attempts
        await anyio.sleep(WINDOW_SECONDS)
        during = attempts - before

        assert 2 <= during <= _max_attempts_within(WINDOW_SECONDS) + 1, during
        assert _events(caplog, "listener.disconnected") == 1

        async with relay(port, target.hostname or "127.0.0.1", target.port or 5432):
            await wait_for(lambda: listener.connected, timeout=15, message="LISTEN again")
            tg.cancel_scope.cancel()

    assert _events(caplog, "listener.disconnected") == 1
    assert _events(caplog, "listener.reconnected") == 1


class _KeepaliveMeetsTheEndingError:
    """A connector whose first keepalive meets the connection still taking in the error
    that ended it (what a crash of the server sends): asyncpg's InternalClientError."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.checks = 0

    @property
    def target(self) -> str:
        return "test"

    async def connect(self) -> Any:
        return await asyncpg.connect(self.url)

    async def check(self, conn: Any) -> None:
        self.checks += 1
        if self.checks == 1:
            raise asyncpg.InternalClientError(
                "cannot switch to state 12; another operation (2) is in progress"
            )
        await conn.execute("SELECT 1")


async def test_a_connection_error_of_the_client_itself_only_makes_the_listener_reconnect(
    pg_url: str,
) -> None:
    connector = _KeepaliveMeetsTheEndingError(pg_url)
    listener = Listener(connector, "runq_backoff_test", deliver=lambda _message: None)
    async with anyio.create_task_group() as tg:
        await tg.start(listener.run)
        await wait_for(
            lambda: listener.reconnects == 1 and listener.connected,
            timeout=KEEPALIVE_SECONDS * 3,
            message="the listener reconnected instead of ending the daemon",
        )
        tg.cancel_scope.cancel()
