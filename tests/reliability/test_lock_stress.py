"""Heartbeats, completions and event appends of one busy worker never deadlock (PostgreSQL).

Issue 32's deadlock needed a worker whose heartbeat batch and completion batch keep
touching the same rows. Here one worker runs ``max_concurrency = 64`` with a heartbeat
every 50 ms, handlers of 1-20 ms (every fourth one emits an event, so event appends join
in), beside a second worker of 16 slots with the usual heartbeat, while a producer keeps a
backlog, for 10 seconds (60 in the ``long`` variant). On a private cluster, whose log the
test reads:

* PostgreSQL never logged ``deadlock detected``;
* runq never logged ``run.settle_failed``;
* the ledger (one entry per handler call) shows every run executed exactly once, and
  every run completed.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import wait_for, worker_of
from pgcluster import PgCluster, PgClusterFactory
from serve_harness import RunqSetup, database_for

from runq.context import RunContext
from runq.metrics import REGISTRY
from runq.model import Status
from runq.queue import Queue
from runq.worker.claimer import ClaimerConfig
from runq.worker.heartbeat import HeartbeatConfig
from runq.worker.runtime import WorkerRuntime

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

#: Handler calls: (run id, attempt) per execution, in order.
LEDGER: list[tuple[str, int]] = []
BACKLOG = 300


async def stress(ctx: RunContext, payload: Any) -> Any:
    LEDGER.append((ctx.run_id, ctx.attempt))
    if payload % 4 == 0:
        await ctx.emit("progress", {"i": payload})
    await anyio.sleep(random.uniform(0.001, 0.020))
    return payload


CONFIG = {
    "components": {"task/stress": "reliability.test_lock_stress:stress"},
    "queue": {"max_queue_depth": 0, "poll_interval": 0.05},
    "routing": {"*": "local"},
}


@asynccontextmanager
async def worker(
    setup: RunqSetup, slots: int, heartbeat: float | None
) -> AsyncIterator[WorkerRuntime]:
    """A worker of its own (its own store and pools, as another process would have)."""
    async with setup.queue(CONFIG) as q:
        config = replace(ClaimerConfig.from_config(q.config), max_concurrency=slots)
        runtime, claimer = worker_of(q, config, settle_until_decided=True)
        if heartbeat is not None:
            runtime.heartbeat.config = HeartbeatConfig(interval=heartbeat)
        async with runtime.active(batching=True), anyio.create_task_group() as tg:
            tg.start_soon(claimer.run, tg)
            try:
                yield runtime
            finally:
                claimer.stop()
                await claimer.wait_stopped()


async def produce(q: Queue, stop: anyio.Event, submitted: list[str]) -> None:
    """Keep about ``BACKLOG`` runs queued."""
    i = 0
    while not stop.is_set():
        queued = (await q.store.stats()).counts.get(Status.QUEUED.value, 0)
        if queued < BACKLOG:
            batch = [q.new_run("task", "stress", i + k) for k in range(BACKLOG - queued)]
            i += len(batch)
            submitted += [r.run.id for r in await q.defer_many(batch)]
        await anyio.sleep(0.02)


def _retries(reason: str) -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == "runq_store_retries_total" and sample.labels["reason"] == reason:
                total += sample.value
    return total


@pytest.fixture
async def stress_setup(
    pg_clusters: PgClusterFactory, tmp_path: Path
) -> AsyncIterator[tuple[PgCluster, RunqSetup]]:
    cluster = await pg_clusters.start()
    async with database_for("postgres", tmp_path, store_url=cluster.url) as setup:
        yield cluster, setup


@pytest.mark.parametrize(
    "seconds",
    [pytest.param(10.0, id="short"), pytest.param(60.0, id="long", marks=pytest.mark.long)],
)
async def test_a_busy_worker_with_a_fast_heartbeat_never_deadlocks(
    seconds: float,
    stress_setup: tuple[PgCluster, RunqSetup],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster, setup = stress_setup
    LEDGER.clear()
    caplog.set_level(logging.WARNING, logger="runq")
    deadlocks_before = _retries("deadlock")
    submitted: list[str] = []
    began = time.monotonic()
    async with AsyncExitStack() as stack:
        q = await stack.enter_async_context(setup.queue(CONFIG))
        await stack.enter_async_context(worker(setup, 64, heartbeat=0.05))
        await stack.enter_async_context(worker(setup, 16, heartbeat=None))
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce, q, stop, submitted)
            await anyio.sleep(seconds)  # the load's duration is the test's parameter
            stop.set()

        async def drained() -> bool:
            counts = (await q.store.stats()).counts
            return counts.get(Status.COMPLETED.value, 0) == len(submitted)

        await wait_for(drained, timeout=120, interval=0.2, message="every run completed")
    took = time.monotonic() - began

    executions = Counter(run_id for run_id, _ in LEDGER)
    twice = [run_id for run_id, n in executions.items() if n > 1]
    never = set(submitted) - set(executions)
    settle_failed = [r for r in caplog.records if r.getMessage() == "run.settle_failed"]
    deadlocks = cluster.log().count("deadlock detected")
    with capsys.disabled():
        print(
            f"\nlock stress ({seconds:g}s): {len(submitted)} runs completed in {took:.1f}s "
            f"({len(submitted) / took:.0f}/s), {len(LEDGER)} handler calls, "
            f"deadlocks in PostgreSQL's log: {deadlocks}, "
            f"deadlock retries: {_retries('deadlock') - deadlocks_before:g}, "
            f"warnings: {Counter(r.getMessage() for r in caplog.records)}"
        )
    assert submitted
    assert deadlocks == 0, cluster.log()[-4000:]
    assert not settle_failed, [getattr(r, "runq_fields", {}) for r in settle_failed[:5]]
    assert not twice, twice[:5]
    assert not never, sorted(never)[:5]
    assert all(attempt == 1 for _, attempt in LEDGER)
