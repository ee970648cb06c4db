"""No lock cycles between runq's own statements, and a deadlock is never a decision
(PostgreSQL).

The deadlock of issue 32, reproduced every time: a worker's completion batch and its
heartbeat batch update the same run rows, each in the order its join produced. A barrier
makes the interleaving certain: a row trigger on the run table waits for an advisory lock
the test holds, so each statement stops right after it locked its first row; once both
stand there, the test lets them go and each wants the row the other holds.

* ``test_today_s_statements_deadlock_at_the_barrier`` is the control: the statements as
  they were (rows locked in the order of their input arrays, crafted opposite) deadlock.
* ``test_completion_heartbeat_and_event_append_never_wait_crosswise`` runs runq's
  statements through the same barrier with the same crafted orders: the completion
  locks its rows in id order before it writes, the heartbeat does not wait for a row
  (the rows it skipped are reported busy, not lost), and an event append waits for the
  completion instead of holding a row it needs.
* ``test_a_deadlock_with_another_transaction_is_retried`` forces a real deadlock between
  runq's completion and an outside transaction that locks the same rows crosswise; the
  completion is the one PostgreSQL aborts, and the store runs it again: applied, counted
  in ``runq_store_retries_total``.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import asyncpg.exceptions as pgerr
import pytest
from anyio.abc import TaskGroup
from conftest import PG_URL, drop_schema, open_test_store
from helpers import wait_for

from runq.errors import StoreContention, StoreUnavailable
from runq.loops import is_outage
from runq.metrics import REGISTRY
from runq.model import Completion, Lease, NewEvent, NewRun
from runq.seal import KeyRing
from runq.store.base import Store
from runq.store.postgres.connection import CONTENTION_ATTEMPTS, Pool, session_settings

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

WORKER = "worker-locks"

#: The heartbeat and completion as they were before issue 32 (the locking part): rows
#: taken in whatever order the join produced.
TODAY_HEARTBEAT = """
    UPDATE {s}.runs AS r SET locked_at = extract(epoch from now())
    FROM unnest($2::text[], $3::int[]) AS v(id, attempt)
    WHERE r.id = v.id AND r.attempt = v.attempt AND r.locked_by = $1
    RETURNING r.id"""
TODAY_COMPLETE = """
    UPDATE {s}.runs AS r SET status = 'completed', locked_by = NULL, locked_at = NULL,
        completed_at = extract(epoch from now()), event_seq = r.event_seq + 1
    FROM unnest($2::text[], $3::int[]) AS v(id, attempt)
    WHERE r.id = v.id AND r.attempt = v.attempt AND r.locked_by = $1
    RETURNING r.id"""
#: Nested loops driven by the input array, so the rows are locked in the order given: the
#: only path left to a run row is a bitmap probe by the outer array element's id.
IN_INPUT_ORDER = {
    "enable_hashjoin": "off",
    "enable_mergejoin": "off",
    "enable_seqscan": "off",
    "enable_indexscan": "off",
    "enable_indexonlyscan": "off",
}


class Barrier:
    """A row trigger on the run table that waits for an advisory lock the test holds: a
    statement stops right after it locked the first run row it updates."""

    def __init__(self, conn: asyncpg.Connection, schema: str) -> None:
        self.conn = conn
        self.schema = schema
        self.key = secrets.randbits(62)

    async def install(self) -> None:
        s = self.schema
        await self.conn.execute(
            f"""
            CREATE FUNCTION {s}.test_barrier() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_advisory_xact_lock_shared({self.key});
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_barrier BEFORE UPDATE ON {s}.runs
                FOR EACH ROW EXECUTE FUNCTION {s}.test_barrier();"""
        )

    async def close(self) -> None:
        await self.conn.execute("SELECT pg_advisory_lock($1)", self.key)

    async def open(self) -> None:
        await self.conn.execute("SELECT pg_advisory_unlock($1)", self.key)

    async def waiting(self) -> int:
        """Backends waiting at the barrier."""
        found: int = await self.conn.fetchval(
            """SELECT count(*) FROM pg_locks
               WHERE locktype = 'advisory' AND NOT granted
                 AND ((classid::bigint << 32) | objid::bigint) = $1""",
            self.key,
        )
        return found


@pytest.fixture
async def store(tmp_path: Path, key_ring: KeyRing) -> AsyncIterator[Store]:
    opened, _url, schema = await open_test_store("postgres", tmp_path, key_ring)
    try:
        yield opened
    finally:
        await opened.close()
        await drop_schema(schema)


async def _two_leases(store: Store) -> tuple[Lease, Lease]:
    await store.submit_many([NewRun(component_type="task", component_id="echo") for _ in range(2)])
    claimed = sorted(await store.claim(WORKER, 2, deployment_id=None), key=lambda r: r.id)
    assert len(claimed) == 2
    return claimed[0].lease, claimed[1].lease


async def _connect(settings: dict[str, str]) -> asyncpg.Connection:
    return await asyncpg.connect(PG_URL, server_settings=settings)


async def _outcome(call: Callable[[], Awaitable[Any]], into: dict[str, Any], name: str) -> None:
    try:
        into[name] = await call()
    except asyncpg.PostgresError as e:
        into[name] = e


def _start(
    tg: TaskGroup, found: dict[str, Any], name: str, conn: asyncpg.Connection, sql: str, *args: Any
) -> None:
    """Run one statement in the background; its rows (or its error) go to ``found``."""
    tg.start_soon(_outcome, lambda: conn.fetch(sql, *args), found, name)


@asynccontextmanager
async def statements_at_a_barrier(
    schema: str, *sessions: dict[str, str]
) -> AsyncIterator[tuple[Barrier, TaskGroup, list[asyncpg.Connection]]]:
    """A closed barrier on the run table, a task group, and one connection per session
    (all closed afterwards); the barrier opens when the block ends, if it did not before."""
    control = await _connect({})
    conns = [await _connect(settings) for settings in sessions]
    barrier = Barrier(control, schema)
    try:
        await barrier.install()
        await barrier.close()
        async with anyio.create_task_group() as tg:
            try:
                yield barrier, tg, conns
            finally:
                await barrier.open()
    finally:
        for conn in (*conns, control):
            await conn.close()


async def test_today_s_statements_deadlock_at_the_barrier(store: Store) -> None:
    schema = store.schema  # type: ignore[attr-defined]
    a, b = await _two_leases(store)
    complete, heartbeat = (q.format(s=schema) for q in (TODAY_COMPLETE, TODAY_HEARTBEAT))
    found: dict[str, Any] = {}
    async with statements_at_a_barrier(schema, IN_INPUT_ORDER, IN_INPUT_ORDER) as (
        barrier,
        tg,
        (one, two),
    ):
        _start(tg, found, "complete", one, complete, WORKER, [b.run_id, a.run_id], [1, 1])
        _start(tg, found, "heartbeat", two, heartbeat, WORKER, [a.run_id, b.run_id], [1, 1])
        # Each holds its first row and waits at the barrier; then each wants the other's.
        await wait_for(
            lambda: _equals(barrier.waiting(), 2), timeout=10, message="both at the barrier"
        )
    errors = [v for v in found.values() if isinstance(v, BaseException)]
    assert any(isinstance(e, pgerr.DeadlockDetectedError) for e in errors), found


async def test_completion_heartbeat_and_event_append_never_wait_crosswise(store: Store) -> None:
    schema, sql = store.schema, store.statements  # type: ignore[attr-defined]
    a, b = await _two_leases(store)
    ba, ones = [b.run_id, a.run_id], [1, 1]
    runq_session = session_settings("runq-lock-order")
    found: dict[str, Any] = {}
    async with statements_at_a_barrier(schema, runq_session, runq_session) as (
        barrier,
        tg,
        (completer, events),
    ):
        # The completion, given its rows in the opposite order: it locks both in id order
        # before it writes, then stops at the barrier holding both.
        answers, reasons = [None, None], ["completed", "completed"]
        _start(tg, found, "complete", completer, sql.complete, WORKER, ba, ones, answers, reasons)
        await wait_for(
            lambda: _equals(barrier.waiting(), 1), timeout=10, message="completion waits"
        )
        # The heartbeat does not wait: both rows are busy, neither renewed nor lost.
        with anyio.fail_after(10):
            beat = await store.heartbeat_many(WORKER, [b, a])
        assert not beat.renewed
        assert not beat.lost
        assert {le.run_id for le in beat.busy} == {a.run_id, b.run_id}
        # An event append of both runs waits for the completion's first row; it holds
        # nothing the completion needs.
        _start(tg, found, "reserve", events, sql.events_reserve_many, WORKER, ba, ones, ones)
        await wait_for(
            lambda: _at_least(_row_waiters(barrier.conn, schema), 1),
            timeout=10,
            message="the event append waits for a row",
        )
    assert not [v for v in found.values() if isinstance(v, BaseException)], found
    assert {r["id"] for r in found["complete"]} == {a.run_id, b.run_id}
    assert found["reserve"] == []  # completed meanwhile: the fence turned the append away
    again = await store.heartbeat_many(WORKER, [a, b])
    assert {le.run_id for le in again.lost} == {a.run_id, b.run_id}  # now they are gone


async def test_a_deadlock_with_another_transaction_is_retried(store: Store) -> None:
    """An outside transaction locks B, runq's completion locks A and waits for B, then the
    outside transaction wants A. PostgreSQL aborts the completion (the outside session
    waits 10 s before it looks for a cycle, runq's 1 s); the store runs it again once
    the other transaction committed."""
    schema = store.schema  # type: ignore[attr-defined]
    a, b = await _two_leases(store)
    other = await _connect({"deadlock_timeout": "10s"})
    watcher = await _connect({})
    before = _retries("complete", "deadlock")
    found: dict[str, Any] = {}
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute(f"SELECT 1 FROM {schema}.runs WHERE id = $1 FOR UPDATE", b.run_id)
        async with anyio.create_task_group() as tg:
            done = [Completion(run_id=a.run_id, attempt=1), Completion(run_id=b.run_id, attempt=1)]
            tg.start_soon(_outcome, lambda: store.complete_many(WORKER, done), found, "complete")
            await wait_for(
                lambda: _at_least(_row_waiters(watcher, schema), 1),
                timeout=10,
                message="the completion waits for B",
            )
            await other.execute(f"SELECT 1 FROM {schema}.runs WHERE id = $1 FOR UPDATE", a.run_id)
            await tx.commit()
    finally:
        await other.close()
        await watcher.close()
    assert _retries("complete", "deadlock") >= before + 1
    assert set(found["complete"].applied) == {a.run_id, b.run_id}, found


async def test_events_and_a_completion_of_the_same_runs_do_not_deadlock(store: Store) -> None:
    """The same worker appends events of two runs while completing them with events of
    their own, many times over: the completion batch locks every run in id order first,
    so the two never wait crosswise (the retry counter stays where it was)."""
    before = _retries("events_complete_many", "deadlock") + _retries("append_events", "deadlock")
    for _ in range(20):
        a, b = await _two_leases(store)
        event = [NewEvent(kind="log", data=b'{"n": 1}')]
        done = [
            Completion(run_id=b.run_id, attempt=1, events=tuple(event), trim_level="none"),
            Completion(run_id=a.run_id, attempt=1, events=tuple(event), trim_level="none"),
        ]
        async with anyio.create_task_group() as tg:
            tg.start_soon(store.append_events_many, WORKER, [(a, event), (b, event)])
            tg.start_soon(store.complete_many, WORKER, done)
    after = _retries("events_complete_many", "deadlock") + _retries("append_events", "deadlock")
    assert after == before


def _retries(verb: str, reason: str) -> float:
    found = REGISTRY.get_sample_value("runq_store_retries_total", {"verb": verb, "reason": reason})
    return found or 0.0


async def _row_waiters(conn: asyncpg.Connection, schema: str) -> int:
    found: int = await conn.fetchval(
        """SELECT count(*) FROM pg_stat_activity
           WHERE datname = current_database() AND wait_event_type = 'Lock'
             AND wait_event IN ('tuple', 'transactionid') AND query LIKE '%' || $1 || '%'""",
        f"{schema}.runs",
    )
    return found


async def _equals(value: Awaitable[int], wanted: int) -> bool:
    return await value == wanted


async def _at_least(value: Awaitable[int], wanted: int) -> bool:
    return await value >= wanted


async def test_contention_that_persists_reaches_the_caller_as_store_contention() -> None:
    """The store tries a statement the database keeps aborting a few times, counting each
    abort, then hands ``StoreContention``: a ``StoreUnavailable`` every loop retries, and
    not an outage (the database answered)."""
    pool = Pool(PG_URL, min_size=1, max_size=1, command_timeout=5, connect_timeout=5,
                application_name="runq-test")  # fmt: skip
    tries = 0

    async def aborted() -> None:
        nonlocal tries
        tries += 1
        raise pgerr.SerializationError("could not serialize access")

    before = _retries("test_verb", "serialization")
    with pytest.raises(StoreContention) as raised:
        await pool.contended(aborted, verb="test_verb")
    assert tries == CONTENTION_ATTEMPTS
    assert _retries("test_verb", "serialization") == before + CONTENTION_ATTEMPTS
    assert isinstance(raised.value, StoreUnavailable)
    assert not is_outage(raised.value)
