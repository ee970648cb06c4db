"""Build runs in any state through the Store protocol only, so one factory serves both engines.

``make_run(store, Status.FAILED, attempt=2, max_attempts=2)`` walks the run there with the
same verbs a worker uses (submit, claim by id, fail with retry, complete, pause, cancel).
Times in the past come from shifting ``store.clock_offset_seconds`` around one verb and
putting it back, so the rest of the test sees the normal clock.

``StoreHandle`` adds what the protocol deliberately does not offer: plain SQL on the raw
row (to prove sealing at rest, or to tamper with a column).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
from conftest import drop_schema, open_test_store, require_postgres
from helpers import ordered_run_id

from runq.model import (
    Actor,
    Completion,
    FailOutcome,
    Lease,
    NewRun,
    PurgeReport,
    Run,
    Status,
    TerminationReason,
)
from runq.seal import KeyRing, Sealer
from runq.store import make_store
from runq.store.base import Store

T = TypeVar("T")

_UNSET: Any = object()
DEFAULT_PAYLOAD = {"text": "factory payload"}


class FactoryError(AssertionError):
    """The store did not let the factory reach the requested state (a store bug, or a
    request the state machine cannot reach)."""


@asynccontextmanager
async def shifted_clock(store: Store, seconds: float) -> AsyncIterator[None]:
    """Run the body with the store's clock moved by ``seconds`` (negative = the past)."""
    before = store.clock_offset_seconds
    store.clock_offset_seconds = before + seconds
    try:
        yield
    finally:
        store.clock_offset_seconds = before


async def at_offset(store: Store, seconds: float, call: Callable[[], Awaitable[T]]) -> T:
    async with shifted_clock(store, seconds):
        return await call()


def new_run(
    *,
    component_type: str = "task",
    component_id: str = "echo",
    payload: Any = _UNSET,
    session_id: str | None = None,
    user_id: str | None = None,
    actor: Actor | None = None,
    configuration: str | None = None,
    idempotency_key: str | None = None,
    max_attempts: int = 1,
    deployment_id: str | None = None,
    priority: int = 0,
    delay_seconds: float = 0.0,
    origin: str = "python",
    save_request: bool = True,
    id: str | None = _UNSET,
) -> NewRun:
    """A ``NewRun`` with test defaults (task/echo, a small payload).

    ``id`` defaults to a strictly increasing test id, so "oldest first" in a test never
    depends on two runs sharing a millisecond; pass ``id=None`` to let the store make one.
    """
    return NewRun(
        component_type=component_type,
        component_id=component_id,
        payload=DEFAULT_PAYLOAD if payload is _UNSET else payload,
        session_id=session_id,
        actor=actor if actor is not None else Actor(user_id=user_id),
        configuration=configuration,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        deployment_id=deployment_id,
        priority=priority,
        delay_seconds=delay_seconds,
        origin=origin,
        save_request=save_request,
        id=ordered_run_id() if id is _UNSET else id,
    )


async def submit(store: Store, **fields: Any) -> Run:
    """Submit one run (unbounded depth) and return it; fields as for ``new_run``."""
    result = await store.submit(new_run(**fields), max_queue_depth=0)
    return result.run


async def claim_one(
    store: Store, run: Run, worker: str, *, serialize_sessions: bool = False
) -> Run:
    """Claim exactly this run for ``worker``; fails loudly when the store refuses."""
    claimed = await store.claim(
        worker,
        1,
        deployment_id=run.deployment_id,
        serialize_sessions=serialize_sessions,
        run_id=run.id,
    )
    if len(claimed) != 1 or claimed[0].id != run.id:
        raise FactoryError(f"claim by id of {run.id} returned {[r.id for r in claimed]}")
    return claimed[0]


async def _execute_attempts(store: Store, run: Run, worker: str, attempts: int) -> Run:
    """Claim the run ``attempts`` times, failing each but the last with an immediate retry.

    Returns the run as claimed by the last attempt (running, attempt == ``attempts``).
    """
    current = run
    for n in range(1, attempts + 1):
        current = await claim_one(store, current, worker)
        if current.attempt != n:
            raise FactoryError(f"claim {n} of {run.id} gave attempt {current.attempt}")
        if n < attempts:
            outcome = await store.fail(
                worker,
                current.lease,
                error=f"factory failure of attempt {n}",
                retryable=True,
                retry_in_seconds=0.0,
            )
            if outcome is not FailOutcome.RETRY_SCHEDULED:
                raise FactoryError(f"fail of attempt {n} of {run.id} gave {outcome}")
    return current


async def _reload(store: Store, run_id: str) -> Run:
    run = await store.get(run_id)
    if run is None:
        raise FactoryError(f"run {run_id} vanished")
    return run


async def make_run(
    store: Store,
    status: Status = Status.QUEUED,
    *,
    worker: str = "w-test",
    attempt: int | None = None,
    max_attempts: int | None = None,
    lease_age: float = 0.0,
    finished_ago: float = 0.0,
    non_idempotent: bool = False,
    cancel_requested: bool = False,
    answer: Any = _UNSET,
    keep_answer: bool = True,
    termination_reason: TerminationReason | None = None,
    error: str = "factory error",
    pause_reason: str = "approval",
    state: Any = _UNSET,
    cancelled_from: Status | None = None,
    **fields: Any,
) -> Run:
    """A run in ``status``, built with protocol verbs only (works on every engine).

    - ``attempt``: executions started (queued: earlier ones; default 0 for queued and
      cancelled, else 1). Earlier executions fail with an immediate retry.
    - ``max_attempts``: defaults to just enough (``attempt``, or ``attempt + 1`` for a
      queued run that has been tried before).
    - ``lease_age``: a running run whose last heartbeat is that many seconds ago (stale
      once it exceeds the lock grace used by the test).
    - ``finished_ago``: a completed/failed/cancelled run finished that long ago; a paused
      run paused that long ago.
    - ``non_idempotent``, ``cancel_requested``: marks on a running run (or on the run as it
      was when it failed, for ``non_idempotent``).
    - ``termination_reason``: for failed runs, ``not_retryable`` (default) or
      ``retries_exhausted``; for completed runs, ``completed`` (default) or
      ``budget_exhausted``.
    - ``cancelled_from``: ``queued`` (default), ``paused`` or ``running`` (a settled cancel).
    - every other keyword goes to ``new_run`` (session_id, user_id, configuration,
      deployment_id, priority, payload, save_request, idempotency_key, id, ...).
    """
    if cancelled_from is None:
        cancelled_from = Status.QUEUED if not attempt else Status.RUNNING
    default_attempt = 0 if status is Status.QUEUED else 1
    if status is Status.CANCELLED:
        default_attempt = 0 if cancelled_from is Status.QUEUED else 1
    n = default_attempt if attempt is None else attempt
    queued_at_end = status is Status.QUEUED or (
        status is Status.CANCELLED and cancelled_from is Status.QUEUED
    )
    if max_attempts is None:
        max_attempts = max(1, n + 1 if queued_at_end and n > 0 else n)
    if fields.get("delay_seconds") and not (queued_at_end and n == 0):
        raise FactoryError("delay_seconds only makes sense for a queued run never tried")
    run = await submit(store, max_attempts=max_attempts, **fields)

    if queued_at_end:
        if n:
            running = await _execute_attempts(store, run, worker, n)
            outcome = await store.fail(
                worker, running.lease, error=error, retryable=True, retry_in_seconds=0.0
            )
            if outcome is not FailOutcome.RETRY_SCHEDULED:
                raise FactoryError(f"retry of {run.id} gave {outcome}")
        if status is Status.CANCELLED:
            return await at_offset(store, -finished_ago, lambda: store.cancel(run.id))
        return await _reload(store, run.id)

    if status is Status.CANCELLED and cancelled_from is Status.PAUSED:
        paused = await make_paused(store, run, worker, n, pause_reason, state)
        return await at_offset(store, -finished_ago, lambda: store.cancel(paused.id))

    running = await _execute_attempts(store, run, worker, max(n, 1))

    if status is Status.RUNNING:
        return await _finish_running(
            store, running, worker, lease_age, non_idempotent, cancel_requested
        )

    if non_idempotent:
        await _mark(store, running, worker)

    async with shifted_clock(store, -finished_ago):
        if status is Status.COMPLETED:
            reason = termination_reason or TerminationReason.COMPLETED
            done = await store.complete_many(
                worker,
                [
                    Completion(
                        run_id=run.id,
                        attempt=running.attempt,
                        answer={"answer": "factory"} if answer is _UNSET else answer,
                        keep_answer=keep_answer,
                        termination_reason=reason,
                    )
                ],
            )
            if done.applied != (run.id,):
                raise FactoryError(f"complete of {run.id} gave {done}")
        elif status is Status.FAILED:
            reason = termination_reason or TerminationReason.NOT_RETRYABLE
            retryable = reason is TerminationReason.RETRIES_EXHAUSTED
            if retryable and running.attempt < running.max_attempts and not non_idempotent:
                raise FactoryError("retries_exhausted needs attempt == max_attempts")
            outcome = await store.fail(
                worker, running.lease, error=error, retryable=retryable, retry_in_seconds=0.0
            )
            if outcome is not FailOutcome.DEAD_LETTERED:
                raise FactoryError(f"fail of {run.id} gave {outcome}")
        elif status is Status.PAUSED:
            if not await store.pause(
                worker,
                running.lease,
                reason=pause_reason,
                state={"step": 1} if state is _UNSET else state,
            ):
                raise FactoryError(f"pause of {run.id} was fenced off")
        elif status is Status.CANCELLED:
            await store.cancel(run.id)
            if not await store.settle_cancelled(worker, running.lease):
                raise FactoryError(f"settle_cancelled of {run.id} was fenced off")
        else:  # pragma: no cover - every Status is handled above
            raise FactoryError(f"unknown status {status}")
    return await _reload(store, run.id)


async def make_paused(
    store: Store, run: Run, worker: str, attempts: int, reason: str, state: Any
) -> Run:
    running = await _execute_attempts(store, run, worker, max(attempts, 1))
    ok = await store.pause(
        worker, running.lease, reason=reason, state={"step": 1} if state is _UNSET else state
    )
    if not ok:
        raise FactoryError(f"pause of {run.id} was fenced off")
    return await _reload(store, run.id)


async def _mark(store: Store, running: Run, worker: str) -> None:
    if not await store.set_non_idempotent(worker, running.lease, True):
        raise FactoryError(f"set_non_idempotent of {running.id} was fenced off")


async def _finish_running(
    store: Store,
    running: Run,
    worker: str,
    lease_age: float,
    non_idempotent: bool,
    cancel_requested: bool,
) -> Run:
    if non_idempotent:
        await _mark(store, running, worker)
    if cancel_requested:
        await store.cancel(running.id)
    if lease_age:
        # A heartbeat taken in the past leaves locked_at that many seconds behind.
        async with shifted_clock(store, -lease_age):
            result = await store.heartbeat_many(worker, [running.lease])
        if running.lease not in result.renewed:
            raise FactoryError(f"heartbeat of {running.id} was not renewed: {result}")
    return await _reload(store, running.id)


async def stale_lease(store: Store, run: Run, worker: str, age: float) -> Run:
    """Age an existing lease: its last heartbeat becomes ``age`` seconds ago."""
    async with shifted_clock(store, -age):
        result = await store.heartbeat_many(worker, [Lease(run.id, run.attempt)])
    if Lease(run.id, run.attempt) not in result.renewed:
        raise FactoryError(f"heartbeat of {run.id} was not renewed: {result}")
    return await _reload(store, run.id)


# -- raw access ---------------------------------------------------------------------------


@dataclass
class StoreHandle:
    """A connected store plus what tests need to look under it: URL, schema, plain SQL."""

    store: Store
    engine: str
    url: str
    schema: str
    path: Path | None = None
    extra: list[Store] = field(default_factory=list)

    @property
    def runs_table(self) -> str:
        return f"{self.schema}.runs" if self.engine == "postgres" else f"{self.schema}_runs"

    async def open_another(self, sealer: Sealer, *, migrate: bool = False) -> Store:
        """Another store on the same database/schema (closed with the handle)."""
        other = make_store(self.url, schema=self.schema, sealer=sealer)
        await other.connect()
        if migrate:
            await other.migrate()
        self.extra.append(other)
        return other

    async def close_extra(self) -> None:
        while self.extra:
            await self.extra.pop().close()

    async def raw_fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        """Plain SQL on a separate connection. ``{runs}`` becomes the run table; use ``?``
        placeholders, they are rewritten to ``$n`` for Postgres."""
        sql = sql.replace("{runs}", self.runs_table)
        if self.engine == "postgres":
            sql = _dollar_params(sql)
            conn = await asyncpg.connect(self.url)
            try:
                return [dict(r) for r in await conn.fetch(sql, *args)]
            finally:
                await conn.close()
        assert self.path is not None
        db = sqlite3.connect(self.path, timeout=30)
        try:
            db.row_factory = sqlite3.Row
            rows = db.execute(sql, args).fetchall()
            db.commit()
            return [dict(r) for r in rows]
        finally:
            db.close()

    async def raw_execute(self, sql: str, *args: Any) -> None:
        sql = sql.replace("{runs}", self.runs_table)
        if self.engine == "postgres":
            conn = await asyncpg.connect(self.url)
            try:
                await conn.execute(_dollar_params(sql), *args)
            finally:
                await conn.close()
            return
        assert self.path is not None
        db = sqlite3.connect(self.path, timeout=30)
        try:
            db.execute(sql, args)
            db.commit()
        finally:
            db.close()

    async def raw_row(self, run_id: str) -> dict[str, Any]:
        rows = await self.raw_fetch("SELECT * FROM {runs} WHERE id = ?", run_id)
        assert len(rows) == 1, f"expected one raw row for {run_id}, got {len(rows)}"
        row = rows[0]
        for column in ("payload", "answer", "resume_state", "decision"):
            if row[column] is not None:
                row[column] = bytes(row[column])
        return row


def _dollar_params(sql: str) -> str:
    out: list[str] = []
    n = 0
    for ch in sql:
        if ch == "?":
            n += 1
            out.append(f"${n}")
        else:
            out.append(ch)
    return "".join(out)


async def purge(
    store: Store,
    *,
    retention_seconds: float,
    paused_retention_seconds: float,
    batch_size: int = 500,
    max_batches: int = 1000,
) -> PurgeReport:
    """Call ``purge_batch`` until a batch comes back short, as the retention service does."""
    report = PurgeReport()
    while report.batches < max_batches:
        deleted = await store.purge_batch(
            retention_seconds=retention_seconds,
            paused_retention_seconds=paused_retention_seconds,
            limit=batch_size,
        )
        if deleted:
            report.deleted += deleted
            report.batches += 1
        if deleted < batch_size:
            break
    return report


# -----------------------------------------------------------------------------------------
# fixtures (a test module lists the ones it uses in ``__all__`` after importing them)
# -----------------------------------------------------------------------------------------


@pytest.fixture
def engine_ready(engine: str) -> str:
    """``engine``, with the Postgres probe done outside any event loop (conftest's probe
    uses ``asyncio.run``, which cannot run inside an async fixture)."""
    if engine == "postgres":
        require_postgres()
    return engine


@pytest.fixture
async def handle(
    engine_ready: str, tmp_path: Path, key_ring: KeyRing
) -> AsyncIterator[StoreHandle]:
    """A migrated store on ``engine`` with what tests need to look under it."""
    engine = engine_ready
    store, url, schema = await open_test_store(engine, tmp_path, key_ring)
    h = StoreHandle(
        store=store,
        engine=engine,
        url=url,
        schema=schema,
        path=tmp_path / "runq.db" if engine == "sqlite" else None,
    )
    try:
        yield h
    finally:
        await h.close_extra()
        await store.close()
        if engine == "postgres":
            await drop_schema(schema)
