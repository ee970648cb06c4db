"""The batching writer behind ``ctx.emit``: batches in order, flushed on close, and fenced:
a worker that lost its lease writes nothing more and is told so."""

from __future__ import annotations

import pytest
from helpers import wait_for

from runq.errors import InvalidPayload
from runq.model import Actor, Completion, Lease, NewRun, Run
from runq.store.base import Store
from runq.store.events import new_event
from runq.worker.events import MAX_BATCH, MAX_CARRIED, EventBatcher


async def _claimed(store: Store, worker: str) -> Run:
    new = NewRun(
        component_type="task", component_id="echo", actor=Actor(user_id="u"), max_attempts=3
    )
    submitted = (await store.submit(new, max_queue_depth=0)).run
    (run,) = await store.claim(worker, 1, deployment_id=None, run_id=submitted.id)
    return run


async def test_emitted_events_are_written_in_order_by_close(store: Store) -> None:
    run = await _claimed(store, "w1")
    lost: list[bool] = []
    writer = EventBatcher(store, "w1").writer(Lease(run.id, run.attempt), lambda: lost.append(True))
    count = MAX_BATCH * 2 + 7
    for i in range(count):
        await writer.emit("delta", i)
    await writer.close()
    events = await store.list_events(run.id, after=2, limit=10_000)
    assert [e.data for e in events] == list(range(count))
    assert [e.seq for e in events] == list(range(3, count + 3))
    assert not lost
    assert writer.wrote_data


async def test_a_fenced_off_writer_writes_nothing_and_reports_the_lost_lease(store: Store) -> None:
    run = await _claimed(store, "w1")
    lost: list[bool] = []
    late = EventBatcher(store, "w1").writer(Lease(run.id, run.attempt), lambda: lost.append(True))
    # The lease moves on: the run is given back and claimed by another worker.
    await store.fail("w1", Lease(run.id, 1), error="x", retryable=True, retry_in_seconds=0)
    (again,) = await store.claim("w2", 1, deployment_id=None, run_id=run.id)
    before = [e.seq for e in await store.list_events(run.id, after=0, limit=100)]
    await late.emit("log", "too late")
    await late.close()
    after = await store.list_events(run.id, after=0, limit=100)
    assert [e.seq for e in after] == before
    assert "log" not in [e.kind for e in after]
    assert lost == [True]
    assert late.lost
    await late.emit("log", "still too late")  # dropped quietly once lost
    await late.close()
    assert [e.seq for e in await store.list_events(run.id, after=0, limit=100)] == before
    assert again.attempt == 2


async def test_one_write_serves_several_executions_and_fences_each(store: Store) -> None:
    batcher = EventBatcher(store, "w1")
    kept, other = await _claimed(store, "w1"), await _claimed(store, "w1")
    lost: list[str] = []
    writers = [
        batcher.writer(Lease(run.id, run.attempt), lambda run=run: lost.append(run.id))
        for run in (kept, other)
    ]
    await store.cancel(other.id)  # running: the cancel is only recorded
    assert await store.settle_cancelled("w1", Lease(other.id, other.attempt))  # lease gone
    for writer in writers:
        await writer.emit("step", {"run": writer.lease.run_id})
    for writer in writers:
        await writer.close()
    assert lost == [other.id]
    kept_events = await store.list_events(kept.id, after=0, limit=10)
    assert [e.kind for e in kept_events] == ["submitted", "claimed", "step"]
    other_kinds = [e.kind for e in await store.list_events(other.id, after=0, limit=10)]
    assert "step" not in other_kinds


async def test_a_bad_event_raises_at_emit(store: Store) -> None:
    run = await _claimed(store, "w1")
    writer = EventBatcher(store, "w1").writer(Lease(run.id, run.attempt), lambda: None)
    with pytest.raises(InvalidPayload):
        await writer.emit("claimed", None)
    with pytest.raises(InvalidPayload):
        await writer.emit("log", object())
    await writer.close()


async def test_the_reaper_trims_the_events_of_a_run_it_dead_letters(store: Store) -> None:
    from runq.maintenance.reaper import Reaper, ReaperConfig

    run = await _claimed(store, "w1")  # max_attempts 3, attempt 1
    lease = Lease(run.id, run.attempt)
    assert await store.set_non_idempotent("w1", lease, True)  # a lost lease here is final
    assert await store.append_events("w1", lease, [new_event("log", "secret")])
    store.clock_offset_seconds = -60.0
    try:
        await store.heartbeat_many("w1", [lease])  # the last heartbeat: a minute ago
    finally:
        store.clock_offset_seconds = 0.0
    config = ReaperConfig(
        lock_grace_seconds=5,
        limit=10,
        interval=1,
        privacy_level="metadata",
        redacted_max_chars=4000,
    )
    report = await Reaper(store, config).run_once()
    assert report.dead_lettered_ids == [run.id]
    events = await store.list_events(run.id, after=0, limit=10)
    assert [e.kind for e in events] == ["submitted", "claimed", "log", "failed"]
    assert events[2].data is None


async def test_a_completion_carries_what_is_unwritten_after_the_writes_under_way(
    store: Store,
) -> None:
    run = await _claimed(store, "w1")
    writer = EventBatcher(store, "w1").writer(Lease(run.id, run.attempt), lambda: None)
    await writer.emit("delta", 0)
    await wait_for(lambda: writer.writing, timeout=10, interval=0, message="a write under way")
    for i in range(1, 4):
        await writer.emit("delta", i)
    rest = await writer.take_rest()
    # The write under way landed first; the rest waits for the completion.
    written = await store.list_events(run.id, after=2, limit=100)
    assert [e.data for e in written] == [0]
    assert [e.kind for e in rest] == ["delta"] * 3
    await writer.emit("delta", 99)  # after the handler returned: dropped
    done = Completion(run_id=run.id, attempt=run.attempt, events=rest)
    assert (await store.complete_many("w1", [done])).applied == (run.id,)
    events = await store.list_events(run.id, after=2, limit=100)
    assert [(e.kind, e.data) for e in events[:-1]] == [("delta", i) for i in range(4)]
    assert events[-1].kind == "completed"


async def test_a_long_backlog_is_written_by_the_batcher_not_carried(store: Store) -> None:
    run = await _claimed(store, "w1")
    writer = EventBatcher(store, "w1").writer(Lease(run.id, run.attempt), lambda: None)
    for i in range(MAX_CARRIED + 1):
        await writer.emit("delta", i)
    assert await writer.take_rest() == ()
    written = await store.list_events(run.id, after=2, limit=10_000)
    assert [e.data for e in written] == list(range(MAX_CARRIED + 1))


async def test_a_lost_lease_leaves_nothing_to_carry(store: Store) -> None:
    run = await _claimed(store, "w1")
    lost: list[bool] = []
    writer = EventBatcher(store, "w1").writer(Lease(run.id, run.attempt), lambda: lost.append(True))
    await store.fail("w1", Lease(run.id, 1), error="x", retryable=True, retry_in_seconds=0)
    await writer.emit("log", "too late")
    await wait_for(lambda: writer.writing, timeout=10, interval=0, message="a write under way")
    await writer.emit("log", "later still")
    assert await writer.take_rest() == ()
    assert lost == [True]
    kinds = [e.kind for e in await store.list_events(run.id, after=0, limit=100)]
    assert "log" not in kinds
