"""What an operator reads during a database outage: a handful of warnings, not a flood.

A loaded ``runq serve`` (runs in flight, a producer submitting over HTTP) loses its private
PostgreSQL cluster for 10 seconds (20 in the ``long`` variant), then gets it back. Its log
from the stop until every run is final must hold:

* one ``store.unreachable`` warning and one ``store.reachable`` warning, the second with
  the outage's length;
* no more than a handful of warnings in all (``MAX_WARNINGS``), each event at most once
  except what a real problem needs;
* no traceback in any line below ERROR (asyncpg's pool warnings included);

and the runs executed during the outage are kept (executed once, completed).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import anyio
import httpx
import pytest
from helpers import wait_for
from pgcluster import PgCluster
from serve_handlers import read_executions
from serve_harness import RunqServer, RunqSetup, ServeFactory

pytestmark = [pytest.mark.anyio, pytest.mark.daemon, pytest.mark.postgres]

CONFIG = {
    "queue": {
        "poll_interval": 1.0,
        "lock_grace_seconds": 60,
        "max_concurrency": 8,
        "max_queue_depth": 0,
    },
    "routing": {"*": "postgres"},
}
#: One warning down, one back, and room for a few real problems.
MAX_WARNINGS = 6
ACTIVE = ("queued", "running", "paused")


def log_lines(server: RunqServer) -> list[dict[str, Any]]:
    lines = []
    for text in server.logs().splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict):
            lines.append(line)
    return lines


async def produce(server: RunqServer, stop: anyio.Event, acked: list[str]) -> None:
    """Two clients submitting runs of 0.3 s, through the outage (answers 503 meanwhile)."""
    counter = iter(range(10**9))

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            i = next(counter)
            body = {"component_type": "task", "component_id": "record", "payload": {"seconds": 0.3}}
            try:
                response = await client.post(f"{server.url}/runs", json=body)
            except httpx.HTTPError:
                response = None
            if response is not None and response.status_code == 202:
                acked.append(response.json()["run_id"])
            await anyio.sleep(0.2 if i % 2 else 0.1)

    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(40.0)) as client,
        anyio.create_task_group() as tg,
    ):
        for _ in range(2):
            tg.start_soon(client_loop, client)


@pytest.mark.parametrize(
    "outage_seconds",
    [pytest.param(10.0, id="10s"), pytest.param(20.0, id="20s", marks=pytest.mark.long)],
)
async def test_an_outage_logs_a_handful_of_warnings(
    outage_seconds: float,
    private_pg: PgCluster,
    private_pg_setup: RunqSetup,
    private_pg_serve_factory: ServeFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = await private_pg_serve_factory(CONFIG)
    stop = anyio.Event()
    acked: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(produce, server, stop, acked)
        await wait_for(lambda: len(acked) >= 20, timeout=30, message="load is running")
        before = len(log_lines(server))
        stopped = time.monotonic()
        await private_pg.stop()
        # The fault itself: the database stays away this long.
        await anyio.sleep(max(stopped + outage_seconds - time.monotonic(), 0))
        await private_pg.start()
        await wait_for(
            lambda: len(acked) >= 20 + 10, timeout=60, message="submissions go through again"
        )
        stop.set()
    await wait_for(
        lambda: _all_final(private_pg_setup), timeout=60, interval=0.5, message="every run final"
    )
    await wait_for(
        lambda: any(line.get("event") == "store.reachable" for line in log_lines(server)[before:]),
        timeout=30,
        message="the daemon says the database is back",
    )
    lines = log_lines(server)[before:]
    warnings = [line for line in lines if line.get("level") in ("warning", "error", "critical")]
    events = Counter(str(line.get("event")) for line in warnings)
    summary = (
        f"outage of {outage_seconds:g}s: {len(warnings)} warnings or worse: {dict(events)}; "
        f"{sum(len(json.dumps(w)) for w in warnings)} bytes\n"
        + "\n".join(json.dumps(w) for w in warnings)
    )
    with capsys.disabled():
        print("\n" + summary)

    tracebacks = [w for w in lines if "exc" in w and w.get("level") not in ("error", "critical")]
    assert not tracebacks, tracebacks[:2]
    assert events["store.unreachable"] == 1, summary
    assert events["store.reachable"] == 1, summary
    back = next(w for w in warnings if w["event"] == "store.reachable")
    assert outage_seconds - 2 <= float(back["outage_seconds"]) <= outage_seconds + 30, back
    assert len(warnings) <= MAX_WARNINGS, summary

    # What executed across the outage was kept: once each, completed.
    executions = Counter(run_id for run_id, _, _ in read_executions(private_pg_setup.workdir))
    assert not [r for r, n in executions.items() if n > 1]


async def _all_final(setup: RunqSetup) -> bool:
    async with setup.queue() as q:
        counts = (await q.store.stats()).counts
    return not any(counts.get(status, 0) for status in ACTIVE)
