"""The event log at the store boundary, on both engines: lifecycle events written with the
transitions, handler batches numbered without gaps, fenced, sealed at rest, trimmed at settle
and purged with their run."""

from __future__ import annotations

import msgspec
import pytest

from runq.errors import InvalidPayload
from runq.model import Actor, Completion, Lease, NewEvent, NewRun, Run, TerminationReason
from runq.store.base import Store
from runq.store.events import new_event


def _new_run() -> NewRun:
    return NewRun(
        component_type="task",
        component_id="echo",
        payload={"text": "hi"},
        actor=Actor(user_id="alice"),
        max_attempts=3,
        origin="test",
    )


async def _claimed(store: Store, worker: str = "w1") -> Run:
    submitted = (await store.submit(_new_run(), max_queue_depth=0)).run
    (run,) = await store.claim(worker, 1, deployment_id=None, run_id=submitted.id)
    return run


def _events(*items: tuple[str, object]) -> list[NewEvent]:
    return [new_event(kind, data) for kind, data in items]


async def test_lifecycle_and_handler_events_share_one_gap_free_sequence(store: Store) -> None:
    run = await _claimed(store)
    lease = Lease(run.id, run.attempt)
    assert await store.append_events("w1", lease, _events(("progress", {"done": 1})))
    assert await store.append_events(
        "w1", lease, _events(("delta", "a"), ("delta", "b"), ("step", None))
    )
    await store.cancel(run.id)  # running: cancel_requested
    assert await store.settle_cancelled("w1", lease)

    events = await store.list_events(run.id, after=0, limit=100)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.kind for e in events] == [
        "submitted",
        "claimed",
        "progress",
        "delta",
        "delta",
        "step",
        "cancel_requested",
        "cancelled",
    ]
    assert events[1].data == {"attempt": 1, "worker": "w1"}
    assert events[2].data == {"done": 1}
    assert events[5].data is None
    assert all(e.attempt == 1 for e in events[1:])
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert [e.seq for e in await store.list_events(run.id, after=4, limit=2)] == [5, 6]


async def test_a_fenced_off_worker_writes_no_event(store: Store) -> None:
    run = await _claimed(store)
    stale = Lease(run.id, run.attempt)
    assert not await store.append_events("someone-else", stale, _events(("log", "x")))
    assert not await store.append_events("w1", Lease(run.id, run.attempt + 1), _events(("a", 1)))
    kinds = [e.kind for e in await store.list_events(run.id, after=0, limit=10)]
    assert kinds == ["submitted", "claimed"]


async def test_retry_and_completion_events(store: Store) -> None:
    run = await _claimed(store)
    await store.fail("w1", Lease(run.id, 1), error="boom", retryable=True, retry_in_seconds=0)
    (again,) = await store.claim("w1", 1, deployment_id=None, run_id=run.id)
    done = Completion(
        run_id=run.id,
        attempt=again.attempt,
        answer={"ok": True},
        keep_answer=True,
        termination_reason=TerminationReason.COMPLETED,
    )
    await store.complete_many("w1", [done])
    events = await store.list_events(run.id, after=0, limit=100)
    assert [e.kind for e in events] == [
        "submitted",
        "claimed",
        "retry_scheduled",
        "claimed",
        "completed",
    ]
    assert events[2].data["reason"] == "boom"
    assert events[3].attempt == 2


async def test_handler_data_is_sealed_at_rest(store: Store) -> None:
    run = await _claimed(store)
    secret = "very-private-progress-text"
    assert await store.append_events("w1", Lease(run.id, 1), _events(("log", secret)))
    raw = await _raw_event_data(store, run.id)
    assert raw
    assert all(secret.encode() not in blob for blob in raw)


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        ("full", ["alice@example.com", {"attempt": 1, "worker": "w1"}]),
        ("redacted", ["[redacted]", {"attempt": 1, "worker": "w1"}]),
        ("metadata", [None, {"attempt": 1, "worker": "w1"}]),
        ("none", [None, None]),
    ],
)
async def test_trimming_at_settle_follows_the_privacy_level(
    store: Store, level: str, expected: list[object]
) -> None:
    run = await _claimed(store)
    assert await store.append_events("w1", Lease(run.id, 1), _events(("log", "alice@example.com")))
    await store.trim_events(run.id, level, 4000)
    events = {e.kind: e for e in await store.list_events(run.id, after=0, limit=10)}
    assert [events["log"].data, events["claimed"].data] == expected
    assert [e.seq for e in events.values()] == [1, 2, 3]


async def test_bad_kinds_and_data_are_refused_before_anything_is_written() -> None:
    for kind in ("", "Upper", "x" * 40, "completed", "with space"):
        with pytest.raises(InvalidPayload):
            new_event(kind, None)
    with pytest.raises(InvalidPayload):
        new_event("log", object())
    with pytest.raises(InvalidPayload):
        new_event("log", "x" * 70_000)
    assert msgspec.json.decode(new_event("log", {"a": 1}).data or b"") == {"a": 1}


async def _raw_event_data(store: Store, run_id: str) -> list[bytes]:
    """The stored data column, read under the store (proves sealing at rest)."""
    if store.engine == "sqlite":
        import sqlite3

        path = store.path  # type: ignore[attr-defined]
        with sqlite3.connect(path) as conn:
            found = conn.execute(
                f"SELECT data FROM {store.schema}_run_events WHERE run_id = ? AND data IS NOT NULL",  # type: ignore[attr-defined]
                (run_id,),
            ).fetchall()
        return [bytes(r[0]) for r in found]
    import asyncpg

    con = await asyncpg.connect(store.url)  # type: ignore[attr-defined]
    try:
        found = await con.fetch(
            f"SELECT data FROM {store.schema}.run_events WHERE run_id = $1 AND data IS NOT NULL",  # type: ignore[attr-defined]
            run_id,
        )
    finally:
        await con.close()
    return [bytes(r[0]) for r in found]
