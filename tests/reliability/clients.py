"""HTTP clients that load a replica: submit (and optionally poll) until told to stop.

Each client submits with a unique ``Idempotency-Key`` and records what it saw: acknowledged
run ids, every status code, transport errors, and the latency of each submission (and of
each poll). Nothing here asserts; the tests decide what was acceptable.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

FINAL = ("completed", "failed", "cancelled")


@dataclass
class LoadStats:
    acked: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    bodies: list[str] = field(default_factory=list)
    submit_latency: list[float] = field(default_factory=list)
    poll_latency: list[float] = field(default_factory=list)
    polled_final: int = 0

    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status.startswith("5"))


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(round(p / 100.0 * (len(ordered) - 1)), len(ordered) - 1)
    return ordered[k]


def record_body(i: int) -> dict[str, Any]:
    return {
        "component_type": "task",
        "component_id": "record",
        "payload": {"i": i, "seconds": (i % 5) * 0.02},
        "max_attempts": 1 + i % 2,
    }


async def run_clients(
    url: Callable[[], str],
    stats: LoadStats,
    stop: anyio.Event,
    *,
    clients: int,
    body: Callable[[int], dict[str, Any]] = record_body,
    poll: bool = False,
    key_prefix: str = "load",
    pause: float = 0.0,
    timeout: float = 10.0,  # noqa: ASYNC109 - the HTTP client's timeout
) -> None:
    """``clients`` concurrent loops against ``url()`` until ``stop`` is set. With ``poll``,
    each client reads its run back (``GET /runs/{id}``) until it is final before the next
    submission, as a caller waiting for a result would."""
    counter = itertools.count()
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)

    async def one(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            i = next(counter)
            started = time.monotonic()
            try:
                response = await client.post(
                    f"{url()}/runs", json=body(i), headers={"Idempotency-Key": f"{key_prefix}-{i}"}
                )
            except httpx.HTTPError as e:
                stats.errors[type(e).__name__] += 1
                await anyio.sleep(0.1)
                continue
            stats.statuses[str(response.status_code)] += 1
            if response.status_code != 202:
                stats.bodies.append(f"{response.status_code} {response.text[:300]}")
                await anyio.sleep(0.05)
                continue
            stats.submit_latency.append(time.monotonic() - started)
            run_id = response.json()["run_id"]
            stats.acked.append(run_id)
            if poll:
                await poll_until_final(client, url, run_id, stats, stop)
            if pause:
                await anyio.sleep(pause)

    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client,
        anyio.create_task_group() as tg,
    ):
        for _ in range(clients):
            tg.start_soon(one, client)


async def poll_until_final(
    client: httpx.AsyncClient,
    url: Callable[[], str],
    run_id: str,
    stats: LoadStats,
    stop: anyio.Event,
) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            response = await client.get(f"{url()}/runs/{run_id}")
        except httpx.HTTPError as e:
            stats.errors[type(e).__name__] += 1
            await anyio.sleep(0.1)
            continue
        stats.statuses[str(response.status_code)] += 1
        if response.status_code != 200:
            stats.bodies.append(f"GET {response.status_code} {response.text[:300]}")
            return
        stats.poll_latency.append(time.monotonic() - started)
        if response.json()["status"] in FINAL:
            stats.polled_final += 1
            return
        await anyio.sleep(0.05)
