"""The event log at the store boundary, on both engines: lifecycle events written with the
transitions, handler batches numbered without gaps, fenced, sealed at rest, trimmed at settle
and purged with their run."""

from __future__ import annotations

import secrets
from pathlib import Path

import msgspec
import pytest
from conftest import TEST_KEY

from runq.errors import InvalidPayload
from runq.maintenance.rotation import KeyRotation
from runq.model import Actor, Completion, Lease, NewEvent, NewRun, Run, TerminationReason
from runq.seal import KeyRing
from runq.store import make_store
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


def _completion(run: Run, events: list[NewEvent], level: str | None = None) -> Completion:
    return Completion(
        run_id=run.id,
        attempt=run.attempt,
        answer={"ok": True},
        events=tuple(events),
        trim_level=level,
        redacted_max_chars=4000,
    )


async def test_a_completion_writes_the_events_it_carries_before_its_completed_event(
    store: Store,
) -> None:
    run = await _claimed(store)
    assert await store.append_events("w1", Lease(run.id, 1), _events(("progress", 1)))
    carried = _events(("delta", "a"), ("delta", "secret-carried-text"), ("step", None))
    result = await store.complete_many("w1", [_completion(run, carried)])
    assert result.applied == (run.id,)
    events = await store.list_events(run.id, after=0, limit=100)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [(e.kind, e.data) for e in events[2:]] == [
        ("progress", 1),
        ("delta", "a"),
        ("delta", "secret-carried-text"),
        ("step", None),
        ("completed", {"termination_reason": "completed", "error": None}),
    ]
    assert [e.at for e in events] == sorted(e.at for e in events)
    raw = await _raw_event_data(store, run.id)
    assert len(raw) == 3
    assert all(b"secret-carried-text" not in blob for blob in raw)
    assert (await store.get(run.id)).answer == {"ok": True}  # type: ignore[union-attr]


async def test_events_a_completion_carries_follow_an_event_that_came_between(
    store: Store,
) -> None:
    """A cancel request recorded while the handler ran adds an event the worker did not
    write: the carried events are numbered after it all the same."""
    run = await _claimed(store)
    await store.cancel(run.id)  # running: only recorded (its own lifecycle event)
    await store.complete_many("w1", [_completion(run, _events(("delta", 1), ("delta", 2)))])
    events = await store.list_events(run.id, after=0, limit=100)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.kind for e in events] == [
        "submitted",
        "claimed",
        "cancel_requested",
        "delta",
        "delta",
        "completed",
    ]
    assert [e.data for e in events[3:5]] == [1, 2]


async def test_a_fenced_off_completion_writes_none_of_the_events_it_carries(
    store: Store,
) -> None:
    run = await _claimed(store)
    ours = _completion(run, _events(("log", "late")))
    stale = Completion(run_id=run.id, attempt=run.attempt + 1, events=ours.events)
    other = await _claimed(store)
    # Another worker's and a wrong attempt's completions are fenced off; the batch's own
    # run (``other``, with nothing carried) still completes.
    result = await store.complete_many("someone-else", [ours])
    assert result.fenced_off == (run.id,)
    result = await store.complete_many("w1", [stale, Completion(run_id=other.id, attempt=1)])
    assert result.fenced_off == (run.id,)
    assert result.applied == (other.id,)
    kinds = [e.kind for e in await store.list_events(run.id, after=0, limit=10)]
    assert kinds == ["submitted", "claimed"]


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        # stored log, carried log, claimed, completed
        ("full", ["alice@example.com", "bob@example.com", {"attempt": 1, "worker": "w1"}, True]),
        ("redacted", ["[redacted]", "[redacted]", {"attempt": 1, "worker": "w1"}, True]),
        ("metadata", [None, None, {"attempt": 1, "worker": "w1"}, True]),
        ("none", [None, None, None, False]),
    ],
)
async def test_a_completion_trims_the_run_s_events_to_its_level(
    store: Store, level: str, expected: list[object]
) -> None:
    """What trim_events does after a settle, done by the completion's own write: the events
    stored before and the ones it carries obey the level once it applied."""
    run = await _claimed(store)
    assert await store.append_events("w1", Lease(run.id, 1), _events(("log", "alice@example.com")))
    carried = _events(("carried", "bob@example.com"))
    await store.complete_many("w1", [_completion(run, carried, level)])
    events = {e.kind: e for e in await store.list_events(run.id, after=0, limit=10)}
    completed_has_info = events["completed"].data is not None
    got = [events["log"].data, events["carried"].data, events["claimed"].data, completed_has_info]
    assert got == expected
    assert [e.seq for e in events.values()] == [1, 2, 3, 4, 5]
    if level != "full":
        raw = await _raw_event_data(store, run.id)
        assert all(b"example.com" not in blob for blob in raw)


async def test_key_rotation_reseals_event_data(store: Store, tmp_path: Path) -> None:
    """``runq keys rotate`` (``KeyRotation``) re-seals handler data in the event log too:
    afterwards it opens with the new key alone."""
    run = await _claimed(store)
    await store.append_events("w1", Lease(run.id, 1), _events(("log", {"n": 1}), ("tick", None)))
    await store.complete_many("w1", [_completion(run, _events(("log", {"n": 2})))])
    new_key = secrets.token_bytes(32)
    rotated = await _reopened(store, tmp_path, KeyRing([new_key, TEST_KEY]))
    try:
        report = await KeyRotation(rotated, page_size=1).run()
        assert report.done
        assert report.resealed >= 3  # the payload, the answer and two event values
        again = await KeyRotation(rotated).run()
        assert again.resealed == 0  # nothing left under the old key
    finally:
        await rotated.close()
    only_new = await _reopened(store, tmp_path, KeyRing([new_key]))
    try:
        logs = [e.data for e in await only_new.list_events(run.id, after=0, limit=10)]
    finally:
        await only_new.close()
    assert logs[2:] == [
        {"n": 1},
        None,
        {"n": 2},
        {"termination_reason": "completed", "error": None},
    ]


async def _reopened(store: Store, tmp_path: Path, key_ring: KeyRing) -> Store:
    """Another store on the same database and schema, with other keys."""
    sqlite_url = f"sqlite:///{tmp_path / 'runq.db'}"
    url = sqlite_url if store.engine == "sqlite" else store.url  # type: ignore[attr-defined]
    other = make_store(url, schema=store.schema, sealer=key_ring)  # type: ignore[attr-defined]
    await other.connect()
    return other
