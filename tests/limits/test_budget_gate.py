"""The budget gate, asked before the claim (a refusal after it would cost the run its
attempt), on both engines.

The claimers of the daemon are driven in the test process so the database clock can be
moved past midnight (``store.clock_offset_seconds``)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import anyio
import pytest
from helpers import wait_for
from serve_harness import RunqSetup, runq_engine, runq_setup

from runq.context import RunContext
from runq.limits.budget import BudgetGate
from runq.model import Actor, Status, UsageTotals
from runq.ops.operations import Operations
from runq.worker.claimer import Claimer, ClaimerConfig, sweep
from runq.worker.runtime import WorkerRuntime

pytestmark = [pytest.mark.anyio]
__all__ = ["runq_engine", "runq_setup"]  # fixtures used by name

TOKENS_PER_RUN = 7
COST_PER_RUN = 0.25


async def metered(ctx: RunContext, payload: Any) -> Any:
    await ctx.record_usage(tokens=TOKENS_PER_RUN, cost=COST_PER_RUN)
    left = await ctx.budget_left()
    return {"runs_left": None if left is None else left.runs}


BUDGET = {
    "budget": {"timezone": "UTC", "limits": [{"scope": "user", "period": "day", "max_runs": 3}]},
    "components": {"task/metered": "limits.test_budget_gate:metered"},
}


async def statuses(q: Any, ids: list[str]) -> list[Status]:
    return [(await q.get(i)).status for i in ids]


async def drive_claims(q: Any, runtime: WorkerRuntime, passes_until: Any) -> None:
    """Run a 16-slot claimer until ``passes_until()`` holds, then stop it."""
    config = replace(ClaimerConfig.from_config(q.config), max_concurrency=16, poll_interval=0.05)
    claimer = Claimer(q.store, runtime, config)
    async with runtime.active(), anyio.create_task_group() as tg:
        tg.start_soon(claimer.run, tg)
        await wait_for(passes_until, timeout=20, message="claims did not settle")
        claimer.stop()


async def test_a_user_over_the_cap_waits_while_others_run_and_runs_after_midnight(
    runq_setup: RunqSetup,
) -> None:
    async with runq_setup.queue(BUDGET) as q:
        a_ids = [
            (await q.defer("task", "metered", {}, actor=Actor(user_id="alice"))).run.id
            for _ in range(4)
        ]
        b_ids = [
            (await q.defer("task", "metered", {}, actor=Actor(user_id="bob"))).run.id
            for _ in range(3)
        ]
        runtime = WorkerRuntime(store=q.store, config=q.config, components=q.components)

        async def settled() -> bool:
            done = await statuses(q, a_ids[:3] + b_ids)
            return all(s is Status.COMPLETED for s in done)

        await drive_claims(q, runtime, settled)
        # A 16-slot claim pass must not let alice's fourth run through with the others.
        assert await statuses(q, a_ids) == [Status.COMPLETED] * 3 + [Status.QUEUED]
        assert (await q.get(a_ids[3])).attempt == 0
        held = await q.get(a_ids[3])
        reason = await Operations(q.store, q.config).why_waiting(held)
        assert reason is not None
        assert reason.kind == "budget", reason
        assert reason.message.startswith("budget user:day of user alice exhausted (runs 3/3)")
        assert reason.until is not None
        assert reason.until % 86400 == 0

        gate = BudgetGate(q.config.budget, q.store)
        now = await q.store.now()
        totals = await q.store.usage_totals(gate.usage_keys("alice", None, now))
        assert list(totals.values()) == [
            UsageTotals(cost=3 * COST_PER_RUN, tokens=3 * TOKENS_PER_RUN, runs=3)
        ]
        answers = [(await q.get(i)).answer for i in a_ids[:3]]
        # Each handler saw its own claim counted; how many siblings were counted by then
        # depends on scheduling, but never more than the cap.
        assert all(0 <= a["runs_left"] <= 2 for a in answers)

        # Past midnight (database clock) the period resets and the held run is claimed.
        q.store.clock_offset_seconds = math.ceil((now // 86400 + 1) * 86400 - now) + 5

        async def fourth_done() -> bool:
            return (await q.get(a_ids[3])).status is Status.COMPLETED

        await drive_claims(q, runtime, fourth_done)
        run = await q.get(a_ids[3])
        assert (run.status, run.attempt) == (Status.COMPLETED, 1)


async def test_a_cost_cap_holds_back_a_configuration(runq_setup: RunqSetup) -> None:
    overrides = {
        "budget": {
            "limits": [{"scope": "configuration", "period": "month", "max_cost": 0.5}],
        },
        "components": {"task/metered": "limits.test_budget_gate:metered"},
    }
    async with runq_setup.queue(overrides) as q:
        gpt = [(await q.defer("task", "metered", {}, configuration="gpt")).run.id for _ in range(3)]
        other = (await q.defer("task", "metered", {}, configuration="small")).run.id
        runtime = WorkerRuntime(store=q.store, config=q.config, components=q.components)
        for _ in range(5):  # one run at a time, so each spend is seen before the next claim
            await sweep(q.store, runtime, limit=1, time_limit=10, deployment_id=None)
        # 0.25 + 0.25 reaches the 0.5 cap: the third gpt run stays queued, "small" runs.
        assert await statuses(q, gpt) == [Status.COMPLETED, Status.COMPLETED, Status.QUEUED]
        assert (await q.get(other)).status is Status.COMPLETED
