"""``Heartbeat.run_once`` against a store that fails on demand: every lease renewed in one
call, a lost lease stops its execution (unless its completion is already handed in), a
requested cancel stops it at once, and after a failed pass the next comes sooner than
the interval."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from fake_store import FakeStore
from helpers import a_run, wait_for

from runq.errors import StoreUnavailable
from runq.model import Run, Status
from runq.worker.execution import Execution, Interrupt
from runq.worker.heartbeat import Heartbeat, HeartbeatConfig
from runq.worker.inflight import InFlight

pytestmark = [pytest.mark.anyio]


def running(run_id: str) -> Run:
    return a_run(run_id, status=Status.RUNNING, attempt=1, locked_by="w", locked_at=1.0)


def in_flight(*run_ids: str) -> tuple[InFlight, dict[str, Execution]]:
    inflight = InFlight()
    host: Any = object()  # the heartbeat never calls into the executor
    executions = {run_id: Execution(run=running(run_id), executor=host) for run_id in run_ids}
    for execution in executions.values():
        inflight.add(execution)
    return inflight, executions


def heartbeat(store: FakeStore, inflight: InFlight, interval: float = 60.0) -> Heartbeat:
    fake: Any = store
    return Heartbeat(fake, "w", inflight, HeartbeatConfig(interval=interval))


async def test_every_lease_is_renewed_in_one_call() -> None:
    store = FakeStore()
    inflight, executions = in_flight("a", "b", "c")
    report = await heartbeat(store, inflight).run_once()
    assert (report.renewed, report.lost, report.cancelled) == (3, 0, 0)
    assert store.calls["heartbeat_many"] == 1
    assert all(ex.interrupted is None for ex in executions.values())


async def test_a_lost_lease_stops_its_execution_unless_its_completion_is_handed_in() -> None:
    store = FakeStore()
    inflight, executions = in_flight("a", "b")
    inflight.hand_in(executions["b"])  # its completion's write is what decides it
    store.lost = {("a", 1), ("b", 1)}
    report = await heartbeat(store, inflight).run_once()
    assert report.lost == 1
    assert executions["a"].interrupted is Interrupt.LEASE_LOST
    assert executions["b"].interrupted is None


async def test_a_requested_cancel_stops_the_execution_at_once() -> None:
    store = FakeStore()
    inflight, executions = in_flight("a", "b")
    store.cancel_requested = ["b"]
    report = await heartbeat(store, inflight).run_once()
    assert report.cancelled == 1
    assert executions["b"].interrupted is Interrupt.CANCELLED
    assert executions["a"].interrupted is None


async def test_a_failed_pass_raises_and_the_loop_retries_well_before_the_interval() -> None:
    store = FakeStore()
    inflight, _ = in_flight("a")
    service = heartbeat(store, inflight, interval=3600.0)
    store.go_away()
    with pytest.raises(StoreUnavailable):
        await service.run_once()
    async with anyio.create_task_group() as tg:
        tg.start_soon(service.run)
        # The pass at start fails; an hour's interval would hide the retry, the backoff
        # (a fraction of a second) does not.
        await wait_for(lambda: store.calls["heartbeat_many"] >= 3, timeout=10, message="retry")
        store.come_back()
        seen = store.calls["heartbeat_many"]
        await wait_for(
            lambda: store.calls["heartbeat_many"] > seen, timeout=10, message="a pass succeeds"
        )
        tg.cancel_scope.cancel()
