"""Finding 14: a lost lease means a lost lease.

The heartbeat reported ``lease.lost`` for runs whose batched completion had committed a few
milliseconds before its statement ran (false warnings in fault-free runs, and an alert that
cried wolf). An execution whose completion is handed in is recognised: its write decides,
and a write fenced off is reported as the real loss it is.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from store.factories import claim_one, submit

from runq.metrics import LEASES_LOST
from runq.model import Completion, TerminationReason
from runq.store.base import Store
from runq.worker.executor import Execution
from runq.worker.heartbeat import Heartbeat, HeartbeatConfig
from runq.worker.inflight import InFlight, Interrupt

pytestmark = pytest.mark.anyio

WORKER = "w-heartbeat"


async def _in_flight(store: Store, inflight: InFlight) -> Execution:
    run = await claim_one(store, await submit(store), WORKER)
    execution = Execution(run=run, executor=cast(Any, None))
    inflight.add(execution)
    return execution


async def test_a_completion_that_landed_first_is_not_a_lost_lease(store: Store) -> None:
    inflight = InFlight()
    heartbeat = Heartbeat(store, WORKER, inflight, HeartbeatConfig(interval=1.0))
    lost_before = LEASES_LOST._value.get()
    for _ in range(20):  # many short runs, each finishing just before a heartbeat
        execution = await _in_flight(store, inflight)
        inflight.hand_in(execution)
        done = Completion(
            run_id=execution.run.id,
            attempt=execution.run.attempt,
            answer=None,
            keep_answer=False,
            termination_reason=TerminationReason.COMPLETED,
        )
        assert (await store.complete_many(WORKER, [done])).applied == (execution.run.id,)
        report = await heartbeat.run_once()
        assert report.lost == 0
        assert execution.interrupted is None
        inflight.remove(execution)
    assert LEASES_LOST._value.get() == lost_before


async def test_a_real_loss_is_still_reported(store: Store) -> None:
    inflight = InFlight()
    heartbeat = Heartbeat(store, WORKER, inflight, HeartbeatConfig(interval=1.0))
    execution = await _in_flight(store, inflight)
    # A peer's reaper judges the lease stale and dead-letters the run: a real loss.
    assert (await store.reap_stale(lock_grace_seconds=-1.0, limit=10)).dead_lettered == 1
    report = await heartbeat.run_once()
    assert report.lost == 1
    assert execution.interrupted is Interrupt.LEASE_LOST
