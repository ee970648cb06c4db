"""The executor's outcomes, through the ``sync`` transport: ``enqueue()`` executes in the
test process with the same executor the daemon uses, so each outcome is one call away."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from helpers import wait_for
from serve_handlers import read_executions
from serve_harness import RunqSetup, pg_ready, pg_setup, runq_engine, runq_setup

from runq.errors import BadRequest, NotFound, UnknownComponent
from runq.listing import RunFilter
from runq.model import NewRun, Run, Status, TerminationReason
from runq.worker.claimer import sweep
from runq.worker.runtime import WorkerRuntime

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["pg_ready", "pg_setup", "runq_engine", "runq_setup"]  # fixtures used by name


async def sweep_once(q: Any) -> None:
    runtime = WorkerRuntime(store=q.store, config=q.config, components=q.components)
    await sweep(q.store, runtime, limit=10, time_limit=30, deployment_id=None)


async def test_timeout_is_a_retryable_failure(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue({"queue": {"timeout_seconds": 0.3}}) as q:
        started = time.monotonic()
        run = await q.enqueue("task", "sleep", {"seconds": 30}, max_attempts=2)
        assert time.monotonic() - started < 5
    assert (run.status, run.attempt) == (Status.QUEUED, 1)
    assert run.error == "timed out after 0.3 s"


async def test_permanent_fails_without_retry_and_retryable_honours_retry_after(
    runq_setup: RunqSetup,
) -> None:
    async with runq_setup.queue() as q:
        permanent = await q.enqueue(
            "task", "fail", {"message": "bad input", "permanent": True}, max_attempts=3
        )
        assert permanent.status is Status.FAILED
        assert permanent.termination_reason is TerminationReason.NOT_RETRYABLE
        assert permanent.error == "bad input"

        retried = await q.enqueue("task", "flaky", {"retry_after": 120}, max_attempts=3)
        assert (retried.status, retried.error) == (Status.QUEUED, "rate limited")
        assert retried.available_at - await q.store.now() > 110

        exhausted = await q.enqueue("task", "fail", {"message": "again"}, max_attempts=1)
        assert exhausted.termination_reason is TerminationReason.RETRIES_EXHAUSTED


async def test_pause_then_continue_resumes_with_state_and_decision(runq_setup: RunqSetup) -> None:
    # The answer shows what the handler received; a continued run keeps it only when asked.
    async with runq_setup.queue({"privacy": {"keep_answer_after_approval": True}}) as q:
        paused = await q.enqueue("task", "approve", {})
        assert (paused.status, paused.pause_reason) == (Status.PAUSED, "approval")
        continued = await q.continue_(paused.id, {"approved": True})
        assert continued.status is Status.QUEUED
        await sweep_once(q)
        done = await q.get(paused.id)
    assert done is not None
    assert done.status is Status.COMPLETED
    assert done.answer == {"state": {"step": 1}, "decision": {"approved": True}}
    assert done.attempt == 2


async def test_a_continued_run_keeps_no_answer_by_default(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue() as q:
        paused = await q.enqueue("task", "approve", {})
        await q.continue_(paused.id, {"approved": True})
        await sweep_once(q)
        done = await q.get(paused.id)
    assert done is not None
    assert (done.status, done.answer) == (Status.COMPLETED, None)


async def test_budget_stop_completes_with_the_partial_answer(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue() as q:
        run = await q.enqueue("task", "spend", {})
    assert run.status is Status.COMPLETED
    assert run.termination_reason is TerminationReason.BUDGET_EXHAUSTED
    assert run.answer == {"partial": True}
    assert (run.tokens, run.cost) == (10, 0.5)


async def test_a_failure_inside_a_non_idempotent_section_is_not_retried(
    runq_setup: RunqSetup,
) -> None:
    async with runq_setup.queue() as q:
        run = await q.enqueue("task", "half_written", {}, max_attempts=3)
    assert (run.status, run.attempt) == (Status.FAILED, 1)
    assert run.termination_reason is TerminationReason.NOT_RETRYABLE


async def test_privacy_none_keeps_no_answer(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue({"privacy": {"level": "none"}}) as q:
        run = await q.enqueue("task", "echo", {"secret": "x"})
    assert run.status is Status.COMPLETED
    assert run.answer is None


async def test_submissions_are_validated(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue() as q:
        with pytest.raises(UnknownComponent):
            await q.defer("task", "nope")
        with pytest.raises(BadRequest):
            await q.defer("robot", "echo")
        assert await q.store.stats() is not None
        assert (await q.store.stats()).counts.get("queued", 0) == 0


async def test_a_cancel_is_not_swallowed_and_a_kept_cancel_stops_the_next_attempt_at_once(
    runq_setup: RunqSetup,
) -> None:
    async with runq_setup.queue() as q, anyio.create_task_group() as tg:
        result: dict[str, Run] = {}

        async def execute() -> None:
            result["run"] = await q.enqueue("task", "swallow", {})

        tg.start_soon(execute)

        async def running() -> Run | None:
            page = await q.store.list_jobs(where=RunFilter(statuses=(Status.RUNNING,)))
            return page.data[0] if page.data else None

        run = await wait_for(running, timeout=10, message="the run executes")
        await q.cancel(run.id)
        await wait_for(lambda: "run" in result, timeout=5, message="the execution ends")
        cancelled = result["run"]
        assert cancelled.status is Status.CANCELLED
        assert cancelled.answer is None  # "swallowed" never became the answer

        # Requeued with the cancel kept: the next attempt is cancelled before any work.
        requeued = await q.requeue(run.id)
        assert (requeued.status, requeued.cancel_requested) == (Status.QUEUED, True)
        await sweep_once(q)
        again = await q.get(run.id)
    assert again is not None
    assert (again.status, again.attempt) == (Status.CANCELLED, 2)


async def test_an_unknown_component_run_fails_not_retryable_in_a_sweep(
    runq_setup: RunqSetup,
) -> None:
    async with runq_setup.queue() as q:
        stored = await q.store.submit(
            NewRun(component_type="task", component_id="gone", max_attempts=3), max_queue_depth=0
        )
        await sweep_once(q)
        run = await q.get(stored.run.id)
    assert run is not None
    assert (run.status, run.termination_reason) == (Status.FAILED, TerminationReason.NOT_RETRYABLE)
    assert run.error == "unknown component task/gone"
    assert read_executions(runq_setup.workdir) == []


async def test_errors_inside_queue_open_propagate_unwrapped(runq_setup: RunqSetup) -> None:
    # Queue.open hosts the NOTIFY coalescer in a task group; the caller still sees NotFound.
    with pytest.raises(NotFound):
        async with runq_setup.queue() as q:
            await q.cancel("no-such-run")


@pytest.mark.postgres
async def test_a_failed_dispatch_fails_the_run_but_a_failed_defer_wake_up_leaves_it_queued(
    pg_setup: RunqSetup,
) -> None:
    async with pg_setup.queue({"routing": {"*": "postgres"}}) as q:

        async def broken(payload: str) -> None:
            raise OSError("NOTIFY refused")

        q.store.notifications().send = broken  # type: ignore[method-assign]
        run = await q.enqueue("task", "echo", {"x": 1})
        assert run.status is Status.FAILED
        assert run.termination_reason is TerminationReason.NOT_RETRYABLE
        assert (run.error or "").startswith("dispatch failed: NOTIFY refused")

        deferred = await q.defer("task", "echo", {"x": 2})
        assert (await q.get(deferred.run.id)).status is Status.QUEUED  # type: ignore[union-attr]
