"""Database faults: PostgreSQL restarted, and stopped, under a loaded ``runq serve``.

The server is a private cluster of the test's own (``private_pg``, tests/pgcluster.py), so
restarting and stopping it cuts off nobody else: these tests run beside the others (they
used to stop the machine's shared server and had to run alone).

One replica executes runs (each takes 0.3 s, so some are always in flight) while a producer
submits over HTTP and a prober reads ``/readyz`` and ``/healthz``. The server is restarted,
then stopped until the outage is observed (the ``long`` variant keeps it stopped for 20
seconds), then started. The test proves:

* the daemon stays up: ``/healthz`` answers 200 throughout and the process never exits;
* ``/readyz`` reports the outage (503, "database unreachable") and recovers (200);
* submissions during the outage answer 503 ``store_unavailable``, nothing else; every
  acknowledged (202) submission exists afterwards;
* claims resume: every run reaches a final status after the outage;
* LISTEN resumes: the listener reconnects, and a run submitted from another process is
  executed at once although the replica polls only every 30 seconds.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest
from helpers import wait_for
from pgcluster import PgCluster
from serve_handlers import read_executions
from serve_harness import RunqServer, RunqSetup, ServeFactory

from runq.model import Status

pytestmark = [pytest.mark.anyio, pytest.mark.daemon, pytest.mark.postgres]

POLL = 30.0
CONFIG = {
    "queue": {
        # A slow poll: a run executed within a second of a NOTIFY was woken by LISTEN.
        "poll_interval": POLL,
        "lock_grace_seconds": 6,
        "stop_timeout_seconds": 2,
        "max_concurrency": 16,
        "max_queue_depth": 0,
        "retry_delay_seconds": 0.2,
    },
    "routing": {"*": "postgres"},
}
FINAL = ("completed", "failed", "cancelled")


@dataclass
class Observed:
    acked: list[tuple[float, str]] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    unavailable: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    ready: list[tuple[float, int, str]] = field(default_factory=list)
    health_failures: list[str] = field(default_factory=list)

    def acked_since(self, t: float) -> int:
        return sum(1 for at, _ in self.acked if at >= t)

    def ready_since(self, t: float, status: int) -> tuple[float, int, str] | None:
        return next((r for r in self.ready if r[0] >= t and r[1] == status), None)


async def produce(server: RunqServer, seen: Observed, stop: anyio.Event) -> None:
    """Four clients, one try per submission: during an outage the answer must be a 503."""
    counter = iter(range(10**9))

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            i = next(counter)
            body = {
                "component_type": "task",
                "component_id": "record",
                "payload": {"seconds": 0.3, "i": i},
                "max_attempts": 1 + i % 2,
            }
            try:
                response = await client.post(
                    f"{server.url}/runs", json=body, headers={"Idempotency-Key": f"pg-{i}"}
                )
            except httpx.HTTPError as e:
                seen.unexpected.append(f"{i}: {type(e).__name__} {e}")
                await anyio.sleep(0.1)
                continue
            seen.statuses[str(response.status_code)] += 1
            if response.status_code == 202:
                seen.acked.append((time.monotonic(), response.json()["run_id"]))
            elif response.status_code == 503:
                seen.unavailable.append((time.monotonic(), response.json()))
            else:
                seen.unexpected.append(f"{i}: {response.status_code} {response.text[:300]}")
            await anyio.sleep(0.1)

    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(40.0)) as client,
        anyio.create_task_group() as tg,
    ):
        for _ in range(4):
            tg.start_soon(client_loop, client)


async def probe(server: RunqServer, seen: Observed, stop: anyio.Event) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
        beat = 0
        while not stop.is_set():
            try:
                ready = await client.get(f"{server.url}/readyz")
                detail = ready.json().get("detail", "")
                seen.ready.append((time.monotonic(), ready.status_code, detail))
                beat += 1
                if beat % 5 == 0:
                    health = await client.get(f"{server.url}/healthz")
                    if health.status_code != 200:
                        seen.health_failures.append(f"/healthz {health.status_code}")
            except httpx.HTTPError as e:
                seen.health_failures.append(f"{type(e).__name__}: {e}")
            await anyio.sleep(0.1)


async def unfinished(setup: RunqSetup) -> int:
    import asyncpg

    conn = await asyncpg.connect(setup.store_url)
    try:
        value: int = await conn.fetchval(
            f"SELECT count(*) FROM {setup.schema}.runs WHERE status NOT IN {FINAL!r}"
        )
    finally:
        await conn.close()
    return value


@pytest.mark.parametrize(
    "outage_seconds",
    [pytest.param(0.0, id="short"), pytest.param(20.0, id="long", marks=pytest.mark.long)],
)
async def test_a_loaded_daemon_rides_out_postgres_restarts_and_an_outage(
    outage_seconds: float,
    private_pg: PgCluster,
    private_pg_setup: RunqSetup,
    private_pg_serve_factory: ServeFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pg, pg_setup = private_pg, private_pg_setup
    server = await private_pg_serve_factory(CONFIG)
    seen = Observed()
    stop = anyio.Event()
    marks: dict[str, float] = {}
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce, server, seen, stop)
            tg.start_soon(probe, server, seen, stop)
            await wait_for(lambda: len(seen.acked) >= 40, timeout=30, message="load is running")

            # 1. A restart under load.
            marks["restart"] = time.monotonic()
            await pg.restart()
            marks["restarted"] = time.monotonic()
            await wait_for(
                lambda: seen.ready_since(marks["restarted"], 200),
                timeout=30,
                message="/readyz answers 200 after the restart",
            )
            await wait_for(
                lambda: seen.acked_since(marks["restarted"]) >= 20,
                timeout=30,
                message="submissions are acknowledged after the restart",
            )

            # 2. An outage: stopped until readiness and a submission report it (and, in the
            # long variant, for 20 seconds), then started.
            marks["stop"] = time.monotonic()
            await pg.stop()
            await wait_for(
                lambda: (
                    seen.ready_since(marks["stop"], 503)
                    and any(at >= marks["stop"] for at, _ in seen.unavailable)
                ),
                timeout=20,
                message="/readyz and a submission report the outage",
            )
            if outage_seconds:
                # The fault itself: the database stays away this long.
                await anyio.sleep(max(marks["stop"] + outage_seconds - time.monotonic(), 0))
            await pg.start()
            marks["started"] = time.monotonic()
            await wait_for(
                lambda: seen.ready_since(marks["started"], 200),
                timeout=30,
                message="/readyz answers 200 after the outage",
            )
            marks["ready"] = seen.ready_since(marks["started"], 200)[0]  # type: ignore[index]
            await wait_for(
                lambda: seen.acked_since(marks["started"]) >= 20,
                timeout=30,
                message="submissions are acknowledged after the outage",
            )
            stop.set()
    finally:
        stop.set()

    assert server.returncode is None, "the daemon exited"
    assert not seen.health_failures, seen.health_failures[:5]
    assert not seen.unexpected, seen.unexpected[:5]
    assert set(seen.statuses) <= {"202", "503"}, seen.statuses
    outage_answers = [body for at, body in seen.unavailable if at >= marks["stop"]]
    assert outage_answers
    assert all(body["error"] == "store_unavailable" for _, body in seen.unavailable)
    down = [r for r in seen.ready if marks["stop"] <= r[0] <= marks["started"] and r[1] == 503]
    assert down
    assert all("database unreachable" in detail for _, _, detail in down), down[:3]

    # Claims resume: every run (acknowledged or not) reaches a final status.
    settle = 30.0 + (POLL if outage_seconds else 0.0)
    await wait_for(
        lambda: _all_final(pg_setup),
        timeout=settle,
        interval=0.5,
        message="every run final after the outage",
    )
    async with pg_setup.queue({"routing": {"*": "postgres"}}) as q:
        runs = {run_id: await q.get(run_id) for _, run_id in seen.acked}
        lost = [run_id for run_id, run in runs.items() if run is None]
        assert not lost, f"acknowledged and lost: {lost[:5]}"
        by_status = Counter(run.status.value for run in runs.values() if run is not None)

        # A run whose handler finished while the database was away keeps its completion:
        # it is neither executed again nor dead-lettered once the database is back.
        executions = Counter(run_id for run_id, _, _ in read_executions(pg_setup.workdir))
        twice = [run_id for run_id, n in executions.items() if n > 1]
        assert not twice, f"executed again after an outage: {twice[:5]}"
        executed = [runs[r] for r in executions if r in runs]
        not_kept = [
            (r.id, r.status.value, r.error)
            for r in executed
            if r is not None and r.status is not Status.COMPLETED
        ]
        assert not not_kept, f"executed but not completed: {not_kept[:5]}"

        # LISTEN resumed: a run submitted from this process (NOTIFY) runs at once.
        # One outage logs once each way; restarts close together may count as one outage,
        # so what must hold is that the last word of the listener is that it came back.
        # The listener backs off with jitter, so its reconnect may still be due: wait for it.
        def listener_back() -> bool:
            logs = server.logs()
            return logs.rfind('"listener.reconnected"') > logs.rfind('"listener.disconnected"') >= 0

        await wait_for(listener_back, timeout=30, message="the listener came back")
        sent = time.monotonic()
        probe_run = (await q.defer("task", "echo", "after the outage")).run
        done = await wait_for(
            lambda: _status_of(q, probe_run.id, Status.COMPLETED),
            timeout=POLL / 3,
            message="a NOTIFY wakes the replica after the outage",
        )
        woke_in = time.monotonic() - sent
        assert done
        assert woke_in < 5, f"took {woke_in:.1f}s: found by the poll, not woken by LISTEN"

    lines = [
        f"postgres faults ({f'stopped {outage_seconds:g}s' if outage_seconds else 'short'}):",
        f"  submissions by status: {dict(seen.statuses)}; acknowledged runs by status now: "
        f"{dict(by_status)}; executed once each: {len(executions)}",
        f"  /readyz 503 answers during the outage: {len(down)}; ready again "
        f"{marks['ready'] - marks['started']:.1f}s after the server was back",
        f"  woken through LISTEN {woke_in:.2f}s after a NOTIFY (poll_interval {POLL:g}s)",
    ]
    with capsys.disabled():
        print("\n" + "\n".join(lines))


async def _all_final(setup: RunqSetup) -> bool:
    return await unfinished(setup) == 0


async def _status_of(q: Any, run_id: str, status: Status) -> bool:
    run = await q.get(run_id)
    return run is not None and run.status is status
