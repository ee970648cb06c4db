"""The claimer never runs more than ``max_concurrency`` runs at once (both engines)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import anyio
import pytest
from helpers import wait_for
from serve_harness import RunqSetup, runq_engine, runq_setup

from runq.context import RunContext
from runq.model import Status
from runq.worker.claimer import Claimer, ClaimerConfig
from runq.worker.runtime import WorkerRuntime

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup"]  # fixtures used by name

LIMIT = 4
RUNS = 40
_concurrency = {"now": 0, "max": 0}


async def tracked(ctx: RunContext, payload: Any) -> Any:
    _concurrency["now"] += 1
    _concurrency["max"] = max(_concurrency["max"], _concurrency["now"])
    try:
        await anyio.sleep(0.01)
    finally:
        _concurrency["now"] -= 1
    return None


async def test_claims_never_exceed_max_concurrency(runq_setup: RunqSetup) -> None:
    _concurrency.update(now=0, max=0)
    overrides = {"components": {"task/tracked": "test_claimer_limit:tracked"}}
    async with runq_setup.queue(overrides) as q:
        ids = [(await q.defer("task", "tracked", {})).run.id for _ in range(RUNS)]
        runtime = WorkerRuntime(store=q.store, config=q.config, components=q.components)
        config = ClaimerConfig.from_config(q.config)
        claimer = Claimer(
            q.store, runtime, replace(config, max_concurrency=LIMIT, poll_interval=0.05)
        )

        async def all_done() -> bool:
            return (await q.store.stats()).counts.get(Status.COMPLETED.value, 0) == RUNS

        async with runtime.active(batching=True), anyio.create_task_group() as tg:
            tg.start_soon(claimer.run, tg)
            await wait_for(all_done, timeout=60, message="all runs complete")
            claimer.stop()
        assert len(ids) == RUNS
    assert _concurrency["max"] == LIMIT
