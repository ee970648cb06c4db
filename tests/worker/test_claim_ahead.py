"""Claiming ahead (both engines): while handlers finish faster than a claim takes, the
claimer asks for more runs than it has free slots and starts them as slots free, never
running more than ``max_concurrency`` at once; slow handlers claim nothing ahead; a run
that waited too long for a slot, or is still waiting at the drain, goes back to the queue
with its attempt not spent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import anyio
import pytest
from helpers import wait_for, worker_of
from serve_harness import RunqSetup, runq_engine, runq_setup

import runq.worker.claimer as claimer_module
from runq.context import RunContext
from runq.model import Lease, Status
from runq.queue import Queue
from runq.worker.claimer import Claimer, ClaimerConfig
from runq.worker.runtime import WorkerRuntime

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup"]  # fixtures used by name

_concurrency = {"now": 0, "max": 0}
_gate: dict[str, anyio.Event] = {}


async def quick(ctx: RunContext, payload: Any) -> Any:
    _concurrency["now"] += 1
    _concurrency["max"] = max(_concurrency["max"], _concurrency["now"])
    await anyio.lowlevel.checkpoint()
    _concurrency["now"] -= 1
    return None


async def slow(ctx: RunContext, payload: Any) -> Any:
    await anyio.sleep(0.3)
    return None


async def held(ctx: RunContext, payload: Any) -> Any:
    await _gate["open"].wait()
    return None


COMPONENTS = {
    "components": {
        "task/quick": "test_claim_ahead:quick",
        "task/slow": "test_claim_ahead:slow",
        "task/held": "test_claim_ahead:held",
    }
}


class RecordingStore:
    """The queue's store, recording how many runs each claim asked for."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.asked: list[int] = []
        self.given_back: list[Sequence[Lease]] = []

    async def claim(self, worker_id: str, slots: int, **kwargs: Any) -> Any:
        self.asked.append(slots)
        return await self._store.claim(worker_id, slots, **kwargs)

    async def give_back(self, worker_id: str, leases: Sequence[Lease]) -> None:
        self.given_back.append(leases)
        await self._store.give_back(worker_id, leases)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _worker(q: Queue, limit: int) -> tuple[RecordingStore, WorkerRuntime, Claimer]:
    store = RecordingStore(q.store)
    config = replace(ClaimerConfig.from_config(q.config), max_concurrency=limit, poll_interval=0.05)
    runtime, claimer = worker_of(q, config, store=store)
    return store, runtime, claimer


async def _completed(q: Queue) -> int:
    return (await q.store.stats()).counts.get(Status.COMPLETED.value, 0)


async def test_fast_handlers_are_claimed_ahead_within_the_cap(runq_setup: RunqSetup) -> None:
    _concurrency.update(now=0, max=0)
    runs, limit = 400, 4
    async with runq_setup.queue({**COMPONENTS, "queue": {"max_queue_depth": 0}}) as q:
        await q.defer_many([q.new_run("task", "quick", {}) for _ in range(runs)])
        store, runtime, claimer = _worker(q, limit)
        async with runtime.active(batching=True), anyio.create_task_group() as tg:
            tg.start_soon(claimer.run, tg)
            await wait_for(
                lambda: _completed_equals(q, runs), timeout=60, message=f"{runs} runs completed"
            )
            claimer.stop()
    assert _concurrency["max"] <= limit
    assert max(store.asked) > limit, store.asked  # claimed ahead of the free slots
    assert max(store.asked) <= (1 + claimer_module.CLAIM_LOOPS) * limit


async def _completed_equals(q: Queue, n: int) -> bool:
    return await _completed(q) == n


async def test_slow_handlers_are_not_claimed_ahead(runq_setup: RunqSetup) -> None:
    runs, limit = 6, 2
    async with runq_setup.queue(COMPONENTS) as q:
        for _ in range(runs):
            await q.defer("task", "slow", {})
        store, runtime, claimer = _worker(q, limit)
        async with runtime.active(batching=True), anyio.create_task_group() as tg:
            tg.start_soon(claimer.run, tg)
            await wait_for(
                lambda: _completed_equals(q, runs), timeout=60, message="all runs complete"
            )
            claimer.stop()
    assert max(store.asked) <= limit, store.asked


async def _held_worker(
    q: Queue,
) -> tuple[RecordingStore, WorkerRuntime, Claimer, list[str]]:
    """One slot, taught that handlers are quick, and two held runs: the first takes the
    slot, the second is claimed ahead and waits."""
    ids = [(await q.defer("task", "held", {})).run.id for _ in range(2)]
    store, runtime, claimer = _worker(q, 1)
    runtime.inflight.note_handler_seconds(1e-6)
    claimer._note_claim_seconds(0.01)
    assert claimer.claim_size() >= 2
    return store, runtime, claimer, ids


async def _kinds(q: Queue, run_id: str) -> list[str]:
    return [e.kind for e in await q.store.list_events(run_id, after=0, limit=50)]


async def test_a_run_waiting_too_long_for_a_slot_is_given_back(
    runq_setup: RunqSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claimer_module, "AHEAD_MAX_WAIT_SECONDS", 0.2)
    # One claim loop: a second loop's claim in flight at the give-back could take the run
    # again (a legitimate race that this test would have to allow for).
    monkeypatch.setattr(claimer_module, "CLAIM_LOOPS", 1)
    _gate["open"] = anyio.Event()
    async with runq_setup.queue(COMPONENTS) as q:
        store, runtime, claimer, ids = await _held_worker(q)
        async with runtime.active(batching=True), anyio.create_task_group() as tg:
            tg.start_soon(claimer.run, tg)
            await wait_for(lambda: store.given_back, timeout=30, message="a run given back")
            (given,) = store.given_back[0]
            waiting = await q.get(given.run_id)
            assert waiting is not None
            assert (waiting.status, waiting.attempt) == (Status.QUEUED, 0)
            # Given back once: no more is claimed ahead until a handler ends, over several
            # claim passes (the poll is 0.05 s).
            passes = claimer.passes
            await wait_for(
                lambda: claimer.passes >= passes + 3, timeout=30, message="three claim passes"
            )
            assert claimer.claim_size() == 0
            assert runtime.inflight.waiting == 0
            assert len(store.given_back) == 1
            _gate["open"].set()
            await wait_for(lambda: _completed_equals(q, 2), timeout=30, message="both complete")
            claimer.stop()
        done = await q.get(given.run_id)
        assert done is not None
        assert done.attempt == 1
        assert await _kinds(q, given.run_id) == [
            "submitted",
            "claimed",
            "released",
            "claimed",
            "completed",
        ]
        assert given.run_id in ids


async def test_runs_waiting_for_a_slot_at_the_drain_go_back_to_the_queue(
    runq_setup: RunqSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claimer_module, "CLAIM_LOOPS", 1)
    _gate["open"] = anyio.Event()
    async with runq_setup.queue(COMPONENTS) as q:
        store, runtime, claimer, ids = await _held_worker(q)
        async with runtime.active(batching=True), anyio.create_task_group() as tg:
            tg.start_soon(claimer.run, tg)
            await wait_for(
                lambda: runtime.inflight.waiting == 1, timeout=30, message="one run waiting"
            )
            claimer.stop()
            await claimer.wait_stopped()
            _gate["open"].set()
        (given,) = store.given_back[0]
        back = await q.get(given.run_id)
        assert back is not None
        assert (back.status, back.attempt) == (Status.QUEUED, 0)
        started = await q.get(next(rid for rid in ids if rid != given.run_id))
        assert started is not None
        assert started.status == Status.COMPLETED
