"""``runq.client`` against real ``runq serve`` processes: every verb, key and JWT auth,
errors carrying the server's detail, and an event stream dropped mid-run by a proxy and
resumed with ``Last-Event-ID`` without losing or repeating an event."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anyio
import pytest
from api_support import JWT_SECRET, api_config, jwt_config, mint, server_env
from serve_harness import (  # fixtures are used by name
    RunqServer,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)

from runq.client import (
    AsyncClient,
    AuthError,
    BadRequestError,
    Client,
    ConflictError,
    NotFoundError,
    QueueFullError,
    Status,
)

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]

API_KEY = "client-test-key-0123456789abcdef"
TICKER = {"agent/approve": "api_handlers:approve", "task/ticker": "api_handlers:ticker"}


async def start(serve_factory: ServeFactory, config: dict[str, Any]) -> RunqServer:
    config.setdefault("components", {}).update(TICKER)
    secrets = {"RUNQ_TEST_API_KEY": API_KEY, "RUNQ_TEST_JWT_SECRET": JWT_SECRET}
    return await serve_factory(config, env=server_env(secrets))


class DroppingProxy:
    """A TCP proxy in front of the server whose open connections the test can cut."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.writers: list[asyncio.StreamWriter] = []
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.drop()
        assert self.server is not None
        self.server.close()

    def drop(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while chunk := await src.read(65536):
                    dst.write(chunk)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_sync_client_verbs_with_an_api_key(serve_factory: ServeFactory) -> None:
    server = await start(
        serve_factory, api_config(http={"auth": "key", "key": "env:RUNQ_TEST_API_KEY"})
    )

    def scenario() -> None:
        with Client(server.url, api_key="wrong") as bad, pytest.raises(AuthError) as refused:
            bad.get("x")
        assert refused.value.status == 401
        with Client(server.url, api_key=API_KEY) as client:
            accepted = client.submit("task", "echo", {"n": 1}, idempotency_key="k1")
            assert accepted.created
            again = client.submit("task", "echo", {"n": 2}, idempotency_key="k1")
            assert (again.run_id, again.created) == (accepted.run_id, False)
            run = client.wait(accepted.run_id, timeout=20)
            assert run.status is Status.COMPLETED
            assert run.answer == {"n": 1}
            paused = client.submit("agent", "approve", {"q": 1})
            assert client.wait(paused.run_id, timeout=20).status is Status.PAUSED
            client.continue_(paused.run_id, {"ok": True})
            assert client.wait(paused.run_id, timeout=20).answer["decision"] == {"ok": True}
            queued = client.submit("task", "echo", delay_seconds=3600, timeout_seconds=5)
            assert client.get(queued.run_id).timeout_seconds == 5
            assert client.cancel(queued.run_id).status is Status.CANCELLED
            with pytest.raises(ConflictError):
                client.cancel(accepted.run_id)
            with pytest.raises(NotFoundError) as missing:
                client.get("no-such-run")
            assert missing.value.error == "not_found"
            # A short wait on a run that does not settle returns it as it is.
            later = client.submit("task", "echo", delay_seconds=3600)
            assert client.wait(later.run_id, timeout=0.3).status is Status.QUEUED

    await anyio.to_thread.run_sync(scenario)


async def test_async_batch_errors_and_jwt(serve_factory: ServeFactory) -> None:
    config = jwt_config()
    config["queue"] = {**config.get("queue", {}), "max_delayed": 1500}
    server = await start(serve_factory, config)
    async with AsyncClient(server.url, token=mint("alice")) as client:
        items = [
            {"component": "task/echo", "payload": {"i": i}, "delay_seconds": 3600}
            for i in range(1200)
        ]
        items[517]["component"] = "task/missing"
        with pytest.raises(BadRequestError) as bad:
            await client.submit_many(items)
        assert bad.value.error == "unknown_component"
        assert bad.value.detail.startswith("items[517]: ")
        items[517]["component"] = "task/echo"
        accepted = await client.submit_many(items)  # two requests: 1,000 and 200
        assert len(accepted) == 1200
        assert all(a.created for a in accepted)
        run = await client.get(accepted[1199].run_id)
        assert (run.payload, run.user_id) == ({"i": 1199}, "alice")
        with pytest.raises(QueueFullError) as full:
            await client.submit_many(items[:400])
        assert "max_delayed" in full.value.detail
        assert full.value.retry_after == 5

        # History: every one of alice's runs once, newest first, over pages of 500.
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = await client.list(status="queued", limit=500, cursor=cursor)
            seen += [run.id for run in page.data]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert sorted(seen) == sorted(a.run_id for a in accepted)
        assert seen[0] == accepted[1199].run_id  # newest first
        assert (await client.list(component="task/nothing")).data == []
        with pytest.raises(BadRequestError) as bad_cursor:
            await client.list(cursor="not-a-cursor")
        assert "cursor" in bad_cursor.value.detail
    async with AsyncClient(server.url, token=mint("bob")) as other:
        assert (await other.list()).data == []  # bob sees none of alice's runs


async def test_events_resume_after_a_dropped_connection(serve_factory: ServeFactory) -> None:
    server = await start(serve_factory, api_config())
    proxy = DroppingProxy(int(server.url.rsplit(":", 1)[1]))
    async with proxy as url, AsyncClient(url) as client:
        accepted = await client.submit("task", "ticker", {"ticks": 30, "every": 0.05})
        seen, at_drop = [], 0
        async for event in client.events(accepted.run_id):
            seen.append(event)
            if len([e for e in seen if e.kind == "tick"]) == 5:
                at_drop = proxy.connections
                proxy.drop()  # mid-run: 25 ticks and the final event are still to come
        assert at_drop, "the stream ended before the drop"
        assert proxy.connections > at_drop, "the stream was not resumed on a new connection"
        assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
        assert [e.data["i"] for e in seen if e.kind == "tick"] == list(range(30))
        assert seen[-1].kind == "completed"
