"""The event log's rows under the store (migration 0014 on PostgreSQL): claims and
completions log their own events, ``submitted`` is the run row, and deleting runs deletes
their events without a foreign key. Both engines unless a test says otherwise."""

from __future__ import annotations

import pytest
from factories import StoreHandle, claim_one, engine_ready, handle, make_run, purge, submit

from runq.model import Completion, Status

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle"]  # fixtures used by name

DAY = 86400.0


def _events_table(h: StoreHandle) -> str:
    return f"{h.schema}.run_events" if h.engine == "postgres" else f"{h.schema}_run_events"


async def _stored(h: StoreHandle, run_id: str) -> list[tuple[int, str]]:
    found = await h.raw_fetch(
        f"SELECT seq, kind FROM {_events_table(h)} WHERE run_id = ? ORDER BY seq", run_id
    )
    return [(int(r["seq"]), str(r["kind"])) for r in found]


async def test_a_run_lists_submitted_claimed_completed_each_once(handle: StoreHandle) -> None:
    store = handle.store
    run = await claim_one(store, await submit(store), "w1")
    done = await store.complete_many(
        "w1", [Completion(run_id=run.id, attempt=run.attempt, answer={"ok": 1})]
    )
    assert done.applied == (run.id,)
    events = await store.list_events(run.id, after=0, limit=10)
    assert [(e.seq, e.kind, e.attempt) for e in events] == [
        (1, "submitted", 0),
        (2, "claimed", 1),
        (3, "completed", 1),
    ]
    stored = await store.get(run.id)
    assert stored is not None
    assert events[0].at == pytest.approx(stored.created_at)
    assert events[1].data == {"attempt": 1, "worker": "w1"}
    assert await store.list_events(run.id, after=1, limit=10) == events[1:]
    assert await store.list_events(run.id, after=0, limit=1) == events[:1]
    if handle.engine == "postgres":
        # The claim and the completion wrote their rows; submitted is the run row itself.
        assert await _stored(handle, run.id) == [(2, "claimed"), (3, "completed")]


async def test_a_stored_first_event_is_listed_instead_of_the_synthesized_one(
    handle: StoreHandle,
) -> None:
    """Rows an earlier version stored stay readable once: its ``submitted`` row, and the
    first event of a run older than the event log (which took seq 1)."""
    if handle.engine != "postgres":
        pytest.skip("SQLite stores its submitted rows")
    store = handle.store
    old = await submit(store)
    older = await submit(store)
    table = _events_table(handle)
    await handle.raw_execute(
        f"INSERT INTO {table} (run_id, seq, attempt, at, kind) VALUES (?, 1, 0, 1.0, 'submitted')",
        old.id,
    )
    await handle.raw_execute(
        f"INSERT INTO {table} (run_id, seq, attempt, at, kind) VALUES (?, 1, 1, 2.0, 'claimed')",
        older.id,
    )
    assert [(e.seq, e.kind, e.at) for e in await store.list_events(old.id, after=0, limit=5)] == [
        (1, "submitted", 1.0)
    ]
    assert [(e.seq, e.kind) for e in await store.list_events(older.id, after=0, limit=5)] == [
        (1, "claimed")
    ]


async def test_purging_runs_deletes_their_events_only(handle: StoreHandle) -> None:
    store = handle.store
    old = await make_run(store, Status.COMPLETED, finished_ago=DAY + 60)
    kept = await make_run(store, Status.COMPLETED, finished_ago=60)
    assert await _stored(handle, old.id)
    kept_before = await _stored(handle, kept.id)
    assert kept_before
    store.clock_offset_seconds = 0
    report = await purge(store, retention_seconds=DAY, paused_retention_seconds=0)
    assert report.deleted == 1
    assert await _stored(handle, old.id) == []
    assert await _stored(handle, kept.id) == kept_before
    assert await store.list_events(old.id, after=0, limit=10) == []


async def test_truncating_the_run_table_empties_the_event_log(handle: StoreHandle) -> None:
    if handle.engine != "postgres":
        pytest.skip("TRUNCATE is PostgreSQL's")
    store = handle.store
    run = await make_run(store, Status.COMPLETED)
    assert await _stored(handle, run.id)
    await handle.raw_execute(f"TRUNCATE {handle.schema}.runs")
    assert await handle.raw_fetch(f"SELECT 1 FROM {_events_table(handle)}") == []
