"""What the failover drill drives and measures: an open-loop producer over HTTP, and the
rates read back from the handlers' ledger.

The producer offers ``rate`` submissions a second on a fixed schedule, whatever happens:
each is a new run with its own ``Idempotency-Key``, sent to the replicas in turn by a few
concurrent clients, and retried (same key, next replica) until a 202 acknowledges it, as a
real client would. During an outage the schedule runs on and the backlog waits; after it,
the clients catch up. An acknowledgement is recorded with its time and run id; any answer
other than 202 or 503 is unexpected.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

import anyio
import httpx
from anyio.abc import ObjectReceiveStream
from serve_harness import RunqServer

CLIENTS = 16
RETRY_SECONDS = 0.1


@dataclass
class Ack:
    run_id: str
    #: Epoch seconds of the 202 (time.time(), comparable with the ledger).
    at: float
    tries: int


@dataclass
class Producer:
    servers: list[RunqServer]
    rate: float
    handler_seconds: float
    acked: dict[int, Ack] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    offered: int = 0

    def acked_since(self, at: float) -> int:
        return sum(1 for ack in self.acked.values() if ack.at >= at)

    async def run(self, stop: anyio.Event) -> None:
        """Offer submissions until ``stop``; return once every offered one is acknowledged
        (or its client gave up, which the test reports as unexpected)."""
        send, receive = anyio.create_memory_object_stream[int](math.inf)
        limits = httpx.Limits(max_connections=CLIENTS * 2, max_keepalive_connections=CLIENTS * 2)
        timeout = httpx.Timeout(30.0)
        async with (
            httpx.AsyncClient(limits=limits, timeout=timeout) as client,
            anyio.create_task_group() as tg,
        ):
            for _ in range(CLIENTS):
                tg.start_soon(self._client, client, receive.clone())
            receive.close()
            started = time.monotonic()
            with send:
                while not stop.is_set():
                    due = started + self.offered / self.rate
                    await anyio.sleep(max(due - time.monotonic(), 0))
                    send.send_nowait(self.offered)
                    self.offered += 1

    async def _client(self, client: httpx.AsyncClient, items: ObjectReceiveStream[int]) -> None:
        async with items:
            async for i in items:
                await self._submit(client, i)

    async def _submit(self, client: httpx.AsyncClient, i: int) -> None:
        body = {
            "component_type": "task",
            "component_id": "ledger",
            "payload": {"i": i, "seconds": self.handler_seconds},
            "max_attempts": 1,
        }
        headers = {"Idempotency-Key": f"drill-{i}"}
        deadline = time.monotonic() + 120
        tries = 0
        while time.monotonic() < deadline:
            server = self.servers[(i + tries) % len(self.servers)]
            tries += 1
            try:
                response = await client.post(f"{server.url}/runs", json=body, headers=headers)
            except httpx.HTTPError as e:
                self.statuses[type(e).__name__] += 1
                await anyio.sleep(RETRY_SECONDS)
                continue
            self.statuses[str(response.status_code)] += 1
            if response.status_code == 202:
                self.acked[i] = Ack(response.json()["run_id"], time.time(), tries)
                return
            if response.status_code != 503:
                self.unexpected.append(f"{i}: {response.status_code} {response.text[:200]}")
                return
            await anyio.sleep(RETRY_SECONDS)
        self.unexpected.append(f"{i}: not acknowledged within 120 s")


def first_window_at_rate(
    times: list[float], since: float, rate: float, *, share: float = 0.95, window: float = 1.0
) -> float | None:
    """Seconds from ``since`` to the start of the first ``window`` (sliding in 0.1 s steps)
    that holds at least ``share`` of ``rate`` events: when the fleet was back to the
    offered rate. None when no such window exists (yet)."""
    after = sorted(t for t in times if t >= since)
    needed = share * rate * window
    start, end = 0, 0
    for step in range(int(600 / 0.1)):
        left = since + step * 0.1
        if after and left > after[-1]:
            return None
        while start < len(after) and after[start] < left:
            start += 1
        while end < len(after) and after[end] < left + window:
            end += 1
        if end - start >= needed:
            return left - since
    return None


def lowest_rate(times: list[float], since: float, until: float, window: float = 1.0) -> float:
    """The lowest count in a ``window`` between ``since`` and ``until`` (per second)."""
    lows = []
    left = since
    while left + window <= until:
        lows.append(sum(1 for t in times if left <= t < left + window) / window)
        left += window
    return min(lows) if lows else 0.0
