"""``AsyncClient``: the runq HTTP API from asyncio code (httpx + httpx-sse)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import Any

import anyio
import httpx
from httpx_sse import aconnect_sse

from runq.api.schemas import BatchAccepted, RunOut, SubmitAccepted
from runq.client import wire
from runq.client.errors import ClientError
from runq.model import RunEvent


class AsyncClient:
    """``async with AsyncClient("http://127.0.0.1:7777", api_key=...) as client``.

    ``api_key`` (``[http] auth = key``) or ``token`` (a JWT, ``auth = jwt``); neither for
    ``auth = open``. Every error answer raises a ``ClientError`` subclass carrying the
    server's ``error`` word and ``detail``."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        max_reconnects: int = 10,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.timeout = timeout
        self.max_reconnects = max_reconnects
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=wire.auth_headers(api_key, token),
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- submission ------------------------------------------------------------------------

    async def submit(
        self,
        component_type: str,
        component_id: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> SubmitAccepted:
        """``POST /runs``; ``options`` are its body fields (``session_id``, ``priority``,
        ``delay_seconds``, ``timeout_seconds``, ``unique_key``, ``background``, ...)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = wire.submission(component_type, component_id, payload, options)
        response = await self._http.post("/runs", json=body, headers=headers)
        return wire.decoded(response, SubmitAccepted)

    async def submit_many(self, items: Iterable[Mapping[str, Any]]) -> list[SubmitAccepted]:
        """``POST /runs/batch`` in chunks of 1,000; one answer per item, in order. Each chunk
        is all or nothing; a refused chunk raises and later chunks are not sent."""
        accepted: list[SubmitAccepted] = []
        for chunk in wire.batch_bodies(items):
            response = await self._http.post("/runs/batch", json={"items": chunk})
            accepted += wire.decoded(response, BatchAccepted).items
        return accepted

    # -- reading ---------------------------------------------------------------------------

    async def get(self, run_id: str) -> RunOut:
        return wire.decoded(await self._http.get(f"/runs/{run_id}"), RunOut)

    async def wait(self, run_id: str, timeout: float | None = None) -> RunOut:  # noqa: ASYNC109
        """The run once it is final or paused, or as it is when ``timeout`` seconds passed
        (None: no limit). Long-polls ``GET /runs/{id}?wait=`` in rounds of at most 60 s."""
        clock = wire.WaitClock(timeout)
        while True:
            wait = clock.next_wait()
            response = await self._http.get(
                f"/runs/{run_id}",
                params={"wait": f"{wait:.3f}"} if wait > 0 else None,
                timeout=wire.read_timeout(self.timeout, wait),
            )
            run = wire.decoded(response, RunOut)
            if run.status in wire.SETTLED or clock.expired():
                return run

    async def list(
        self,
        *,
        status: Any = None,
        component: str | None = None,
        session_id: str | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> wire.RunsPage:
        """One page of ``GET /runs``; pass ``next_cursor`` back as ``cursor`` for the next."""
        params = wire.list_params(
            {
                "status": status,
                "component": component,
                "session_id": session_id,
                "created_after": created_after,
                "created_before": created_before,
                "limit": limit,
                "cursor": cursor,
            }
        )
        return wire.decoded(await self._http.get("/runs", params=params), wire.RunsPage)

    async def events(self, run_id: str, after: int = 0) -> AsyncIterator[RunEvent]:
        """``async for event in client.events(run_id)``: the run's events after ``after``,
        then live ones, ending after the final one. A dropped connection is resumed with
        ``Last-Event-ID``, so no event is lost or repeated (``max_reconnects`` in a row)."""
        last, failures = after, 0
        while True:
            try:
                async for event in self._stream(run_id, last):
                    last, failures = event.seq, 0
                    yield event
                    if wire.is_final(event):
                        return
            except wire.RECONNECTABLE:
                pass
            failures += 1  # dropped, or ended without the final event (a restart)
            if failures > self.max_reconnects:
                raise ClientError(0, "stream_lost", f"event stream of {run_id} kept dropping")
            await anyio.sleep(wire.reconnect_delay(failures))

    async def _stream(self, run_id: str, after: int) -> AsyncIterator[RunEvent]:
        headers = {"Last-Event-ID": str(after), "Accept": "text/event-stream"}
        timeout = httpx.Timeout(self.timeout, read=wire.STREAM_READ_TIMEOUT)
        async with aconnect_sse(
            self._http, "GET", f"/runs/{run_id}/events", headers=headers, timeout=timeout
        ) as source:
            if not source.response.is_success:
                await source.response.aread()
                wire.check(source.response)
            async for sse in source.aiter_sse():
                if sse.data:
                    yield wire.event_of(sse.data)

    # -- operator verbs --------------------------------------------------------------------

    async def cancel(self, run_id: str) -> RunOut:
        return wire.decoded(await self._http.post(f"/runs/{run_id}/cancel"), RunOut)

    async def continue_(self, run_id: str, decision: Any = None) -> RunOut:
        response = await self._http.post(f"/runs/{run_id}/continue", json={"decision": decision})
        return wire.decoded(response, RunOut)
