"""The embedded engine: one SQLite file in WAL mode, shared safely by several processes.

The statement texts are in ``statements`` and the connection and transaction policy in
``connection``; this module binds parameters and maps rows. A write is one short
transaction run as one function on the writer's thread, so its statements cannot be
interleaved and cost one hop between the event loop and the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec

from runq.errors import (
    Conflict,
    IdempotencyConflict,
    InvalidTransition,
    NotFound,
    QueueFull,
)
from runq.flow import FlowRules, FlowState, Pause, split_running
from runq.model import (
    FINAL_STATUSES,
    TRANSITIONS,
    BudgetBlock,
    ClaimedRuns,
    Completion,
    FailOutcome,
    FenceResult,
    HeartbeatResult,
    Lease,
    NewEvent,
    NewRun,
    Page,
    QueueHealth,
    ReapReport,
    Run,
    RunEvent,
    ScheduleState,
    SlotFire,
    Stats,
    Status,
    SubmitResult,
    UsageKey,
    UsageTotals,
    WorkerInfo,
    new_run_id,
)
from runq.seal import SEALED_COLUMNS, Sealer
from runq.store import events as event_rows
from runq.store import messages, rows
from runq.store.migration_files import Migration, load_migrations, split_sql
from runq.store.sqlite import statements as sql
from runq.store.sqlite.connection import Body, Connections, Row
from runq.store.statements import check_schema

T = TypeVar("T")
_json = msgspec.json.Encoder()


class SqliteStore:
    """``Store`` on one SQLite file. ``schema`` is a table prefix (``{schema}_runs``)."""

    engine = "sqlite"
    supports_listen = False

    def __init__(self, path: Path, *, schema: str, sealer: Sealer) -> None:
        self.path = Path(path)
        self.schema = check_schema(schema)
        self.clock_offset_seconds = 0.0
        #: ``[limits]`` applied by this process's claims (set by ``open_store``).
        self.flow = FlowRules()
        self._sealer = sealer
        self._db = Connections(self.path)
        self._sql = sql.build(schema)
        self._schedule_sql = sql.build_schedules(schema)

    async def _write(self, body: Body[T]) -> T:
        return await self._db.write(body, self.clock_offset_seconds)

    async def _read(self, body: Body[T]) -> T:
        return await self._db.read(body, self.clock_offset_seconds)

    def _run(self, row: Row) -> Run:
        return rows.row_to_run(row, self._sealer)

    # -- lifecycle ------------------------------------------------------------------------

    async def connect(self) -> None:
        await self._db.connect()

    async def close(self) -> None:
        await self._db.close()

    async def migrate(self) -> int:
        await self._write(lambda conn, now: conn.execute(self._sql.create_migrations_table))
        applied = 0
        for migration in load_migrations("sqlite"):
            # One IMMEDIATE transaction per migration, re-checking inside it: a replica that
            # started at the same moment and won the lock has already applied it.
            if await self._write(functools.partial(self._apply, migration)):
                applied += 1
        return applied

    def _apply(self, migration: Migration, conn: sqlite3.Connection, now: float) -> bool:
        if conn.execute(self._sql.migration_applied, (migration.version,)).fetchone():
            return False
        for statement in split_sql(migration.sql.replace("{schema}", self.schema)):
            conn.execute(statement)
        conn.execute(self._sql.record_migration, (migration.version, migration.name, now))
        return True

    async def check_seal_key(self) -> str | None:
        mine = self._sealer.sealing_key_id.hex()

        def body(conn: sqlite3.Connection, now: float) -> str | None:
            row = conn.execute(self._sql.seal_check_get).fetchone()
            if row is not None and not self._sealer.has_key(bytes.fromhex(row[0])):
                recorded: str = row[0]
                return recorded
            if row is None or row[0] != mine:
                conn.execute(self._sql.seal_check_put, (mine, now))
            return None

        return await self._write(body)

    async def schema_is_current(self) -> bool:
        def body(conn: sqlite3.Connection, now: float) -> set[int]:
            if not conn.execute(self._sql.migrations_table_exists).fetchone():
                return set()
            return {row[0] for row in conn.execute(self._sql.applied_versions)}

        applied = await self._read(body)
        return {mig.version for mig in load_migrations("sqlite")} <= applied

    async def ping(self) -> None:
        await self._db.read_one(sql.PING, ())

    async def now(self) -> float:
        row = await self._db.read_one(sql.NOW, (self.clock_offset_seconds,))
        assert row is not None
        value: float = row[0]
        return value

    # -- producer -------------------------------------------------------------------------

    async def submit(
        self,
        new: NewRun,
        *,
        max_queue_depth: int,
        wake: bool = False,
        max_delayed: int = 0,
        max_queued_per_user: int = 0,
    ) -> SubmitResult:
        # ``wake`` asks for an in-statement NOTIFY; SQLite has none (claimers poll or are
        # woken in process), so it is ignored.
        run_id = new.id or new_run_id()
        # Encode (and seal) before the transaction: a bad payload never takes the write lock.
        encoded = rows.encoded_payload(new)
        values = rows.insert_values(new, run_id, self._sealer, encoded)
        params: dict[str, Any] = {**values._asdict(), "concurrency_key": new.concurrency_key}
        key, user = new.idempotency_key, new.actor.user_id or ""
        delayed, limits = values.delay > 0, (max_delayed, max_queued_per_user)

        unique, unique_component = new.unique, f"{new.component_type}/{new.component_id}"

        def body(conn: sqlite3.Connection, now: float) -> tuple[Row | None, float]:
            # The writer's IMMEDIATE transaction serializes submitters of one unique key.
            if unique is not None:
                held: Row | None = conn.execute(
                    self._schedule_sql.unique_get,
                    {"component": unique_component, "key": unique.key},
                ).fetchone()
                if held is not None and unique.holds(
                    Status(held["status"]), held["created_at"], now
                ):
                    return held, now
            if key is not None:
                existing: Row | None = conn.execute(self._sql.by_key, (key, user)).fetchone()
                if existing is not None:
                    component = f"{existing['component_type']}/{existing['component_id']}"
                    if component != f"{new.component_type}/{new.component_id}":
                        raise IdempotencyConflict(messages.idempotency_conflict(key, component))
                    return existing, now
            self._check_depth(conn, now, delayed, user, max_queue_depth, limits)
            try:
                conn.execute(self._sql.insert, {**params, "now": now})
            except sqlite3.IntegrityError as e:
                raise Conflict(messages.run_exists(run_id)) from e
            if unique is not None:
                conn.execute(
                    self._schedule_sql.unique_set,
                    {"component": unique_component, "key": unique.key, "run_id": run_id},
                )
            return None, now

        existing, now = await self._write(body)
        if existing is not None:
            return SubmitResult(self._run(existing), created=False)
        return SubmitResult(rows.fresh_run(new, values, encoded, now), created=True)

    def _check_depth(
        self,
        conn: sqlite3.Connection,
        now: float,
        delayed: bool,
        user: str,
        max_queue_depth: int,
        limits: tuple[int, int],
    ) -> None:
        """Submit's depth gates (see ``Store.submit``), inside its write transaction."""
        max_delayed, max_per_user = limits
        if delayed and max_delayed > 0:
            count = conn.execute(self._sql.count_delayed, (now, max_delayed)).fetchone()[0]
            if count >= max_delayed:
                raise QueueFull(messages.delayed_full(max_delayed))
        if not delayed and max_queue_depth > 0:
            count = conn.execute(self._sql.count_due, (now, max_queue_depth)).fetchone()[0]
            if count >= max_queue_depth:
                raise QueueFull(messages.queue_full(max_queue_depth))
        if user and max_per_user > 0:
            count = conn.execute(self._sql.count_user_queued, (user, max_per_user)).fetchone()[0]
            if count >= max_per_user:
                raise QueueFull(messages.user_queue_full(max_per_user))

    async def submit_many(self, news: Sequence[NewRun]) -> list[str]:
        ids = [new.id or new_run_id() for new in news]
        batch = [
            {
                **rows.insert_values(
                    new, run_id, self._sealer, rows.encoded_payload(new)
                )._asdict(),
                "concurrency_key": new.concurrency_key,
            }
            for new, run_id in zip(news, ids, strict=True)
        ]

        def body(conn: sqlite3.Connection, now: float) -> None:
            try:
                conn.executemany(self._sql.insert, [{**row, "now": now} for row in batch])
            except sqlite3.IntegrityError as e:
                raise Conflict(messages.bulk_refused(e)) from e

        if batch:
            await self._write(body)
        return ids

    async def get(self, run_id: str) -> Run | None:
        row = await self._db.read_one(self._sql.get, (run_id,))
        return self._run(row) if row is not None else None

    async def cancel(self, run_id: str) -> Run:
        def body(conn: sqlite3.Connection, now: float) -> Row:
            params = {"id": run_id, "now": now}
            row: Row | None = conn.execute(self._sql.cancel_now, params).fetchone()
            if row is None:
                row = conn.execute(self._sql.cancel_request, params).fetchone()
            if row is None:
                row = conn.execute(self._sql.get, (run_id,)).fetchone()
                if row is None:
                    raise NotFound(messages.not_found(run_id))
                if row["status"] != Status.CANCELLED:
                    raise Conflict(messages.cancel_refused(run_id, row["status"]))
            return row

        return self._run(await self._write(body))

    async def continue_(self, run_id: str, decision: Any) -> Run:
        sealed = rows.seal_json(self._sealer, "decision", run_id, decision)

        def body(conn: sqlite3.Connection, now: float) -> Row:
            params = {"id": run_id, "now": now, "decision": sealed}
            row: Row | None = conn.execute(self._sql.continue_, params).fetchone()
            if row is not None:
                return row
            row = conn.execute(self._sql.get, (run_id,)).fetchone()
            if row is None:
                raise NotFound(messages.not_found(run_id))
            if rows.is_repeat_continue(row):
                return row
            raise Conflict(messages.continue_refused(run_id, row["status"]))

        return self._run(await self._write(body))

    async def requeue(
        self, run_id: str, *, clear_cancellation: bool, force: bool, lock_grace_seconds: float
    ) -> Run:
        def body(conn: sqlite3.Connection, now: float) -> Row:
            row: Row | None = conn.execute(self._sql.get, (run_id,)).fetchone()
            if row is None:
                raise NotFound(messages.not_found(run_id))
            if row["status"] not in TRANSITIONS["requeue"].sources:
                raise InvalidTransition(messages.requeue_refused(run_id, row["status"]))
            if rows.requeue_is_too_soon(row, now=now, force=force, grace=lock_grace_seconds):
                raise Conflict(messages.requeue_too_soon(run_id, lock_grace_seconds))
            params = {"id": run_id, "now": now, "clear": 1 if clear_cancellation else 0}
            updated: Row = conn.execute(self._sql.requeue, params).fetchone()
            return updated

        return self._run(await self._write(body))

    # -- worker ---------------------------------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        slots: int,
        *,
        deployment_id: str | None,
        serialize_sessions: bool = True,
        blocked: BudgetBlock | None = None,
        run_id: str | None = None,
    ) -> ClaimedRuns:
        if slots <= 0:
            return ClaimedRuns()
        block = blocked if blocked is not None and not blocked.empty else None
        shape = sql.ClaimShape(
            deployment=bool(deployment_id),
            sessions=serialize_sessions,
            block_users=block is not None and bool(block.users),
            block_configurations=block is not None and bool(block.configurations),
            block_pairs=block is not None and bool(block.pairs),
            by_id=run_id is not None,
            limited=self.flow.enabled,
        )
        statement = self._sql.claims[shape]
        params: dict[str, Any] = {
            "worker": worker_id,
            "slots": 1 if run_id is not None else slots,
            "dep": deployment_id or "",
            "run_id": run_id,
        }
        if block is not None:
            params["bu"] = _json.encode(sorted(block.users)).decode()
            params["bc"] = _json.encode(sorted(block.configurations)).decode()
            params["bp"] = _json.encode(sorted(block.pairs)).decode()

        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            if self.flow.enabled:
                # Under BEGIN IMMEDIATE: no other claimer can start a run between this
                # count and the claim, so the room is exact.
                return self._claim_limited(conn, statement, {**params, "now": now}, now)
            return conn.execute(statement, {**params, "now": now}).fetchall()

        # The transaction runs on the connection thread and finishes even if this coroutine
        # is cancelled meanwhile (a shutdown). Its runs would then sit "running" under a
        # lease nobody holds until the reaper dead-letters them, so give them back instead.
        task = asyncio.ensure_future(self._write(body))
        try:
            claimed = await asyncio.shield(task)
        except asyncio.CancelledError:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await self._release(worker_id, [(r, None) for r in await task])
            raise
        runs, broken = rows.open_claimed(rows.in_claim_order(claimed), self._sealer)
        # A run whose sealed values do not open is given back (queued, attempt restored)
        # with the reason in ``error``, so one bad row neither strands the batch nor gets
        # dead-lettered by a replica holding the wrong key.
        await self._release(worker_id, [(r, messages.not_executed(e)) for r, e in broken])
        return ClaimedRuns(runs, unopenable=(r["id"] for r, _ in broken))

    async def _release(self, worker_id: str, given_back: Sequence[tuple[Row, str | None]]) -> None:
        """Undo a claim (fenced on the lease it took): queued again, attempt restored."""
        if not given_back:
            return
        batch = [
            {"id": r["id"], "attempt": r["attempt"], "worker": worker_id, "error": error}
            for r, error in given_back
        ]

        def body(conn: sqlite3.Connection, now: float) -> None:
            for params in batch:
                conn.execute(self._sql.release, {**params, "now": now})

        await self._write(body)

    def _claim_limited(
        self, conn: sqlite3.Connection, statement: str, params: dict[str, Any], now: float
    ) -> list[Row]:
        """Count what runs and what each rate window has spent, claim within the room left,
        and count the starts into the rate windows, all in the claim's transaction."""
        flow, q = self.flow, self._sql
        rows_running = [
            (r["component"], r["concurrency_key"], r["n"])
            for r in conn.execute(q.running_by_component)
        ]
        running = flow.running_by_group((c, n) for c, _, n in rows_running)
        params["kmax"] = _json.encode(flow.per_key_max()).decode()
        params["krun"] = _json.encode(flow.key_running(rows_running)).decode()
        used = [0] * len(flow.groups)
        if flow.has_rates:
            stored = conn.execute(q.rate_windows_get, (_json.encode(flow.patterns).decode(),))
            used = flow.rate_used(
                now, {r["pattern"]: (r["window_start"], r["used"]) for r in stored}
            )
        params["pats"] = _json.encode(flow.patterns).decode()
        params["rooms"] = _json.encode(flow.room(running, used)).decode()
        found: list[Row] = conn.execute(statement, params).fetchall()
        if flow.has_rates and found:
            bumps = flow.started(now, (f"{r['component_type']}/{r['component_id']}" for r in found))
            conn.executemany(
                q.rate_windows_bump, [(p, start, n) for p, (start, n) in bumps.items()]
            )
        return found

    # -- pauses ------------------------------------------------------------------------

    async def add_pause(
        self, kind: str, target: str, *, reason: str | None, created_by: str | None
    ) -> tuple[Pause, bool]:
        def body(conn: sqlite3.Connection, now: float) -> tuple[Row, bool]:
            q = self._sql
            made = conn.execute(
                q.pause_insert, (new_run_id(), kind, target, reason, created_by, now)
            ).rowcount
            row: Row = conn.execute(q.pause_get, (kind, target)).fetchone()
            return row, made > 0

        row, created = await self._write(body)
        return rows.pause_from_row(row), created

    async def remove_pause(self, key: str, *, kind: str = "", target: str = "") -> Pause | None:
        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            return conn.execute(self._sql.pause_delete, (key, kind, target)).fetchall()

        found = await self._write(body)
        return rows.pause_from_row(found[0]) if found else None

    async def list_pauses(self) -> list[Pause]:
        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            return conn.execute(self._sql.pause_list).fetchall()

        return [rows.pause_from_row(r) for r in await self._read(body)]

    async def flow_state(self) -> FlowState:
        q, patterns = self._sql, _json.encode(self.flow.patterns).decode()

        def body(conn: sqlite3.Connection, now: float) -> FlowState:
            found = conn.execute(q.running_by_component)
            running, keys = split_running((r[0], r[1], r[2]) for r in found)
            stored = conn.execute(q.rate_windows_get, (patterns,))
            windows = {r["pattern"]: (r["window_start"], r["used"]) for r in stored}
            return FlowState(now=now, running=running, windows=windows, keys=keys)

        return await self._read(body)

    async def session_ahead(self, run_id: str, session_id: str) -> bool:
        def body(conn: sqlite3.Connection, now: float) -> bool:
            found = conn.execute(self._sql.session_ahead, {"id": run_id, "session": session_id})
            return bool(found.fetchone()[0])

        return await self._read(body)

    async def queued_by_component(self) -> list[tuple[str, str, int, int]]:
        def body(conn: sqlite3.Connection, now: float) -> list[tuple[str, str, int, int]]:
            found = conn.execute(self._sql.queued_by_component, {"now": now})
            return [(r[0], r[1], r[2], r[3]) for r in found]

        return await self._read(body)

    async def heartbeat_many(self, worker_id: str, leases: Sequence[Lease]) -> HeartbeatResult:
        lease_json = _json.encode(list(leases)).decode()

        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            conn.execute(self._sql.touch_worker, (now, worker_id))
            if not leases:
                return []
            params = {"now": now, "worker": worker_id, "leases": lease_json}
            return conn.execute(self._sql.heartbeat, params).fetchall()

        renewed = await self._write(body)
        return rows.heartbeat_result(
            leases, {(r[0], r[1]) for r in renewed}, (r[0] for r in renewed if r[2])
        )

    async def complete_many(self, worker_id: str, completions: Sequence[Completion]) -> FenceResult:
        if not completions:
            return FenceResult()
        batch: list[dict[str, Any]] = [
            {
                "id": c.run_id,
                "attempt": c.attempt,
                "worker": worker_id,
                "reason": str(c.termination_reason),
                "answer": rows.seal_answer(self._sealer, c),
            }
            for c in completions
        ]

        def body(conn: sqlite3.Connection, now: float) -> set[str]:
            # One transaction, one prepared statement executed per run (no round trips):
            # each write is fenced on its own row, so one lost lease fences only itself.
            applied: set[str] = set()
            for params in batch:
                if conn.execute(self._sql.complete, {**params, "now": now}).fetchone():
                    applied.add(params["id"])
            return applied

        return rows.fence_result(completions, await self._write(body))

    async def _fenced(self, statement: str, worker_id: str, lease: Lease, **extra: Any) -> bool:
        """Run one fenced write; True when it applied."""
        params = {"id": lease.run_id, "attempt": lease.attempt, "worker": worker_id, **extra}

        def body(conn: sqlite3.Connection, now: float) -> bool:
            return conn.execute(statement, {**params, "now": now}).fetchone() is not None

        return await self._write(body)

    async def fail(
        self,
        worker_id: str,
        lease: Lease,
        *,
        error: str,
        retryable: bool,
        retry_in_seconds: float,
    ) -> FailOutcome:
        params = {
            "id": lease.run_id,
            "attempt": lease.attempt,
            "worker": worker_id,
            "error": error,
            "retryable": 1 if retryable else 0,
            "delay": max(float(retry_in_seconds), 0.0),
        }

        def body(conn: sqlite3.Connection, now: float) -> str | None:
            row = conn.execute(self._sql.fail, {**params, "now": now}).fetchone()
            return None if row is None else str(row[0])

        return rows.fail_outcome(await self._write(body))

    async def pause(self, worker_id: str, lease: Lease, *, reason: str, state: Any) -> bool:
        sealed = rows.seal_json(self._sealer, "resume_state", lease.run_id, state)
        return await self._fenced(self._sql.pause, worker_id, lease, reason=reason, state=sealed)

    async def settle_cancelled(self, worker_id: str, lease: Lease) -> bool:
        return await self._fenced(self._sql.settle_cancelled, worker_id, lease)

    async def set_non_idempotent(self, worker_id: str, lease: Lease, inside: bool) -> bool:
        return await self._fenced(
            self._sql.non_idempotent, worker_id, lease, inside=1 if inside else 0
        )

    async def record_usage(
        self, worker_id: str, lease: Lease, *, tokens: int, cost: float, keys: Sequence[UsageKey]
    ) -> None:
        counters = [(k.scope, k.subject, k.period_start, cost, tokens, 0) for k in keys]
        usage = {"id": lease.run_id, "tokens": tokens, "cost": cost}

        def body(conn: sqlite3.Connection, now: float) -> None:
            # Unfenced on purpose: the tokens were spent whether or not the lease survived.
            conn.execute(self._sql.add_run_usage, usage)
            if counters:
                conn.executemany(self._sql.usage_upsert, counters)

        await self._write(body)

    async def count_claimed_run(self, keys: Sequence[UsageKey]) -> None:
        if not keys:
            return
        counters = [(k.scope, k.subject, k.period_start, 0.0, 0, 1) for k in keys]
        await self._write(lambda conn, now: conn.executemany(self._sql.usage_upsert, counters))

    async def usage_totals(self, keys: Sequence[UsageKey]) -> dict[UsageKey, UsageTotals]:
        def body(conn: sqlite3.Connection, now: float) -> dict[UsageKey, UsageTotals]:
            totals: dict[UsageKey, UsageTotals] = {}
            for key in keys:
                row = conn.execute(
                    self._sql.usage_get, (key.scope, key.subject, key.period_start)
                ).fetchone()
                totals[key] = (
                    UsageTotals(cost=row[0], tokens=row[1], runs=row[2])
                    if row is not None
                    else UsageTotals()
                )
            return totals

        return await self._read(body) if keys else {}

    async def usage_in_periods(
        self, periods: Sequence[tuple[str, float]]
    ) -> dict[UsageKey, UsageTotals]:
        def body(conn: sqlite3.Connection, now: float) -> dict[UsageKey, UsageTotals]:
            # One primary-key range probe per period; a gate asks for a handful of periods.
            found: dict[UsageKey, UsageTotals] = {}
            for scope, period_start in dict.fromkeys(periods):
                for row in conn.execute(self._sql.usage_in_period, (scope, period_start)):
                    key = UsageKey(row[0], row[1], row[2])
                    found[key] = UsageTotals(cost=row[3], tokens=row[4], runs=row[5])
            return found

        return await self._read(body) if periods else {}

    # -- maintenance ----------------------------------------------------------------------

    async def reap_stale(self, *, lock_grace_seconds: float, limit: int) -> ReapReport:
        report = ReapReport()
        if limit <= 0:
            return report
        params: dict[str, Any] = {
            "grace": lock_grace_seconds,
            "limit": limit,
            "err_non_idempotent": messages.REAP_NON_IDEMPOTENT_ERROR,
            "err_no_request": messages.REAP_NO_REQUEST_ERROR,
        }

        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            return conn.execute(self._sql.reap, {**params, "now": now}).fetchall()

        # The whole pass is one statement under the write lock, so no lease can be renewed
        # between the scan and the update: ``skipped`` stays 0 on this engine.
        for row in sorted(await self._write(body), key=lambda r: r[0]):
            if row[1] == Status.QUEUED:
                report.requeued += 1
                report.requeued_ids.append(row[0])
            else:
                report.dead_lettered += 1
                report.dead_lettered_ids.append(row[0])
        return report

    async def purge_batch(
        self, *, retention_seconds: float, paused_retention_seconds: float, limit: int
    ) -> int:
        with_paused = paused_retention_seconds > 0  # 0 = paused runs wait until decided
        statement = self._sql.purge_with_paused if with_paused else self._sql.purge
        batch = max(int(limit), 1)

        def body(conn: sqlite3.Connection, now: float) -> int:
            params = {"cutoff": now - retention_seconds, "batch": batch}
            if with_paused:
                params["paused_cutoff"] = now - paused_retention_seconds
            deleted: int = conn.execute(statement, params).rowcount
            return deleted

        return await self._write(body)

    async def register_worker(self, info: WorkerInfo) -> None:
        params = {
            "id": info.id,
            "hostname": info.hostname,
            "pid": info.pid,
            "deployment_id": info.deployment_id or "",
        }
        await self._write(
            lambda conn, now: conn.execute(self._sql.register_worker, {**params, "now": now})
        )

    async def remove_worker(self, worker_id: str) -> None:
        await self._write(lambda conn, now: conn.execute(self._sql.remove_worker, (worker_id,)))

    async def prune_workers(self, *, max_age_seconds: float) -> int:
        def body(conn: sqlite3.Connection, now: float) -> int:
            count: int = conn.execute(self._sql.prune_workers, (now - max_age_seconds,)).rowcount
            return count

        return await self._write(body)

    async def list_workers(self, *, max_age_seconds: float) -> list[WorkerInfo]:
        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            return conn.execute(self._sql.list_workers, (now - max_age_seconds,)).fetchall()

        return [rows.row_to_worker(row) for row in await self._read(body)]

    # -- reads for operators --------------------------------------------------------------

    def _counts(self, conn: sqlite3.Connection) -> dict[str, int]:
        return {row[0]: row[1] for row in conn.execute(self._sql.counts)}

    def _oldest_queued(self, conn: sqlite3.Connection, now: float) -> dict[str, float]:
        """Oldest claimable-since age per deployment; a delayed run is not waiting yet."""
        return {
            row[0]: max(now - row[1], 0.0) for row in conn.execute(self._sql.oldest_queued, (now,))
        }

    async def stats(self) -> Stats:
        def body(conn: sqlite3.Connection, now: float) -> Stats:
            ages = self._oldest_queued(conn, now)
            return Stats(
                counts=self._counts(conn),
                oldest_queued_age_seconds=max(ages.values()) if ages else None,
            )

        return await self._read(body)

    async def health(
        self, *, lock_grace_seconds: float, worker_max_age_seconds: float
    ) -> QueueHealth:
        def body(conn: sqlite3.Connection, now: float) -> QueueHealth:
            ages = self._oldest_queued(conn, now)
            expired = conn.execute(
                self._sql.expired_leases, (now - lock_grace_seconds,)
            ).fetchone()[0]
            live = conn.execute(self._sql.live_workers, (now - worker_max_age_seconds,)).fetchone()[
                0
            ]
            return QueueHealth(
                counts=self._counts(conn),
                oldest_queued_age_seconds=max(ages.values()) if ages else None,
                oldest_queued_age_by_deployment=ages,
                expired_leases=expired,
                live_workers=live,
            )

        return await self._read(body)

    async def list_jobs(
        self,
        *,
        statuses: Sequence[Status] = (),
        page: int = 1,
        limit: int = 20,
        sort_by: str = "created_at",
        sort_order: str = "desc",
        user_id: str | None = None,
    ) -> Page:
        page, limit = max(int(page), 1), max(int(limit), 1)
        page_sql, count_sql = sql.list_jobs(
            self.schema,
            statuses=statuses,
            by_user=user_id is not None,
            sort_by=sort_by,
            sort_order=sort_order,
        )
        params: list[Any] = [str(Status(s)) for s in statuses]
        if user_id is not None:
            params.append(user_id)

        def body(conn: sqlite3.Connection, now: float) -> tuple[int, list[Row]]:
            total: int = conn.execute(count_sql, params).fetchone()[0]
            found = conn.execute(page_sql, [*params, limit, (page - 1) * limit]).fetchall()
            return total, found

        total, found = await self._read(body)
        return Page(data=[self._run(r) for r in found], page=page, limit=limit, total_count=total)

    async def reseal_page(self, *, after_id: str, limit: int) -> tuple[str | None, int]:
        page = await self._read(
            lambda conn, now: conn.execute(
                self._sql.reseal_select, (after_id, max(int(limit), 1))
            ).fetchall()
        )
        if not page:
            return None, 0
        # (statement, (new value, id, old value)): opened and re-sealed outside the write lock.
        updates: list[tuple[str, tuple[bytes, str, bytes]]] = []
        for row in page:
            for column in SEALED_COLUMNS:
                new = rows.resealed(self._sealer, column, row["id"], row[column])
                if new is not None:
                    updates.append((self._sql.reseal_update[column], (new, row["id"], row[column])))

        def body(conn: sqlite3.Connection, now: float) -> int:
            return sum(conn.execute(statement, args).rowcount for statement, args in updates)

        resealed = await self._write(body) if updates else 0
        last: str = page[-1]["id"]
        return last, resealed

    async def count_runs(self) -> int:
        row = await self._db.read_one(self._sql.count_runs, ())
        assert row is not None
        count: int = row[0]
        return count

    async def run_ids_with_prefix(self, prefix: str, *, limit: int) -> list[str]:
        params = {"prefix": prefix, "upper": prefix + _LAST_CHARACTER, "limit": max(limit, 1)}

        def body(conn: sqlite3.Connection, now: float) -> list[str]:
            return [row[0] for row in conn.execute(self._sql.ids_with_prefix, params)]

        return await self._read(body)

    # -- schedules and unique runs ----------------------------------------------------------

    async def schedule_states(self, names: Sequence[str]) -> tuple[float, list[ScheduleState]]:
        encoded = _json.encode(list(names)).decode()
        q = self._schedule_sql

        def body(conn: sqlite3.Connection, now: float) -> tuple[float, list[ScheduleState]]:
            conn.execute(q.ensure_schedules, {"names": encoded, "now": now})
            found = conn.execute(q.schedule_states, {"names": encoded}).fetchall()
            return now, [rows.schedule_state(r) for r in found]

        return await self._write(body)

    async def fire_schedule_slot(
        self, name: str, slot_at: float, new: NewRun, *, skip_if_running: bool
    ) -> SlotFire:
        run_id = new.id or new_run_id()
        encoded = rows.encoded_payload(new)
        params: dict[str, Any] = {
            **rows.insert_values(new, run_id, self._sealer, encoded)._asdict(),
            "concurrency_key": new.concurrency_key,
        }
        q = self._schedule_sql

        def body(conn: sqlite3.Connection, now: float) -> SlotFire:
            fire: str | None = run_id
            if skip_if_running:
                last = conn.execute(q.last_run_status, {"name": name}).fetchone()
                if last is not None and Status(last["status"]) not in FINAL_STATUSES:
                    fire = None
            slot = {"name": name, "slot": slot_at, "run_id": fire, "now": now}
            if conn.execute(q.record_slot, slot).rowcount == 0:
                return SlotFire(recorded=False, run_id=None)
            if fire is not None:
                conn.execute(self._sql.insert, {**params, "now": now})
            conn.execute(q.note_fire, slot)
            return SlotFire(recorded=True, run_id=fire)

        return await self._write(body)

    async def advance_schedule_cursor(self, name: str, cursor_at: float) -> None:
        q = self._schedule_sql.advance_cursor
        await self._write(
            lambda conn, now: conn.execute(q, {"name": name, "cursor": cursor_at, "now": now})
        )

    async def set_schedule_paused(self, name: str, paused: bool) -> ScheduleState:
        q = self._schedule_sql.set_paused

        def body(conn: sqlite3.Connection, now: float) -> ScheduleState:
            row = conn.execute(q, {"name": name, "paused": paused, "now": now}).fetchone()
            return rows.schedule_state(row)

        return await self._write(body)

    async def recent_schedule_slots(
        self, name: str, *, limit: int
    ) -> list[tuple[float, str | None]]:
        q = self._schedule_sql.recent_slots

        def body(conn: sqlite3.Connection, now: float) -> list[tuple[float, str | None]]:
            found = conn.execute(q, {"name": name, "limit": limit}).fetchall()
            return [(r["slot_at"], r["run_id"]) for r in found]

        return await self._read(body)

    async def prune_schedule_slots(self, name: str, *, before: float) -> int:
        q = self._schedule_sql.prune_slots

        def body(conn: sqlite3.Connection, now: float) -> int:
            deleted: int = conn.execute(q, {"name": name, "before": before}).rowcount
            return deleted

        return await self._write(body)

    # -- the event log ------------------------------------------------------------------

    async def append_events(self, worker_id: str, lease: Lease, events: Sequence[NewEvent]) -> bool:
        fence = {"id": lease.run_id, "attempt": lease.attempt, "worker": worker_id}

        def body(conn: sqlite3.Connection, now: float) -> bool:
            if conn.execute(self._sql.events_fence, fence).fetchone() is None:
                return False
            (last,) = conn.execute(self._sql.events_last_seq, (lease.run_id,)).fetchone()
            batch = event_rows.sealed_batch(self._sealer, lease.run_id, last + 1, events)
            conn.executemany(
                self._sql.events_insert,
                [(lease.run_id, seq, lease.attempt, now, kind, data) for seq, kind, data in batch],
            )
            return True

        return await self._write(body) if events else True

    async def append_events_many(
        self, worker_id: str, batches: Sequence[tuple[Lease, Sequence[NewEvent]]]
    ) -> set[str]:
        def body(conn: sqlite3.Connection, now: float) -> set[str]:
            applied: set[str] = set()
            for lease, events in batches:
                fence = {"id": lease.run_id, "attempt": lease.attempt, "worker": worker_id}
                if not events or conn.execute(self._sql.events_fence, fence).fetchone() is None:
                    continue
                (last,) = conn.execute(self._sql.events_last_seq, (lease.run_id,)).fetchone()
                batch = event_rows.sealed_batch(self._sealer, lease.run_id, last + 1, events)
                conn.executemany(
                    self._sql.events_insert,
                    [
                        (lease.run_id, seq, lease.attempt, now, kind, data)
                        for seq, kind, data in batch
                    ],
                )
                applied.add(lease.run_id)
            return applied

        return await self._write(body) if batches else set()

    async def list_events(self, run_id: str, *, after: int, limit: int) -> list[RunEvent]:
        sql = self._sql.events_list
        found = await self._read(
            lambda conn, now: conn.execute(sql, (run_id, after, limit)).fetchall()
        )
        return [event_rows.to_event(self._sealer, run_id, *row) for row in found]

    async def trim_events(self, run_id: str, level: str, redacted_max_chars: int) -> None:
        if level == "full":
            return
        if level == "redacted":
            sealed_sql = self._sql.events_sealed
            stored = await self._read(
                lambda conn, now: conn.execute(sealed_sql, (run_id,)).fetchall()
            )
            resealed = await anyio.to_thread.run_sync(
                event_rows.redacted, self._sealer, run_id, stored, redacted_max_chars
            )
            updates = [(data, run_id, seq) for seq, data in resealed]
            await self._write(lambda conn, now: conn.executemany(self._sql.events_reseal, updates))
            return
        params = {"id": run_id, "all": level == "none"}
        await self._write(lambda conn, now: conn.execute(self._sql.events_trim, params))


__all__ = ["SqliteStore"]


#: Sorts after every character (SQLite compares text as UTF-8 bytes, in code point order),
#: so ``prefix + _LAST_CHARACTER`` bounds every id that starts with ``prefix``.
_LAST_CHARACTER = "\U0010ffff"
