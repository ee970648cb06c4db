"""The embedded engine: one SQLite file in WAL mode, shared safely by several processes.

Design notes (why it looks the way it does):

* Every write is one explicit ``BEGIN IMMEDIATE`` transaction. IMMEDIATE takes the
  file's write lock up front, so two processes never both read-then-write and then
  deadlock on the upgrade; a waiting writer sleeps in SQLite's busy handler
  (``busy_timeout``), never in a retry loop of ours.
* A transaction runs as *one* function on the aiosqlite connection thread
  (``Connection._execute``), so it costs one hop between the event loop and the
  thread instead of one per statement, and no other coroutine can interleave a
  statement into it.
* Reads use a second connection (``query_only``): in WAL mode readers never wait for
  the writer, so ``list_jobs``/``stats`` do not queue behind claims.
* Every timestamp is read from the database clock once at the start of the
  transaction (``:now``) and bound into its statements.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import anyio
import msgspec

from runq.errors import (
    ConfigError,
    Conflict,
    IdempotencyConflict,
    InvalidTransition,
    NotFound,
    QueueFull,
    SealError,
    StoreUnavailable,
)
from runq.model import (
    TRANSITIONS,
    BudgetBlock,
    Completion,
    FailOutcome,
    FenceResult,
    HeartbeatResult,
    Lease,
    NewRun,
    Page,
    PurgeReport,
    QueueHealth,
    ReapReport,
    Run,
    Stats,
    Status,
    SubmitResult,
    UsageKey,
    UsageTotals,
    WorkerInfo,
    new_run_id,
    sql_status_list,
)
from runq.seal import SEALED_COLUMNS, Sealer, sealed_key_id
from runq.store import _common as common

T = TypeVar("T")
Row = sqlite3.Row
Body = Callable[[sqlite3.Connection, float], T]

#: How long a writer waits for another process's write lock before giving up (seconds).
BUSY_TIMEOUT_SECONDS = 10.0
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: The database clock in epoch seconds, plus the (test-only) offset bound as ``?``.
_NOW_SQL = "SELECT (julianday('now') - 2440587.5) * 86400.0 + ?"
_FINAL_IN = "status IN ('completed', 'failed', 'cancelled')"  # matches the partial index text
_ACTIVE_IN = "status IN ('queued', 'running', 'paused')"  # matches the partial index text
_json = msgspec.json.Encoder()


@functools.cache
def _migrations() -> tuple[common.Migration, ...]:
    return tuple(common.load_migrations("sqlite"))


def _clock(conn: sqlite3.Connection, offset: float) -> float:
    value: float = conn.execute(_NOW_SQL, (offset,)).fetchone()[0]
    return value


def _in_transaction(conn: sqlite3.Connection, body: Body[T], offset: float) -> T:
    """Run ``body`` inside BEGIN IMMEDIATE … COMMIT on the connection thread."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body(conn, _clock(conn, offset))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def _in_snapshot(conn: sqlite3.Connection, body: Body[T], offset: float) -> T:
    """Run several reads against one consistent snapshot (a deferred read transaction)."""
    conn.execute("BEGIN")
    try:
        return body(conn, _clock(conn, offset))
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


def _unavailable(path: Path, error: BaseException) -> StoreUnavailable:
    """A clear, operator-facing message for an SQLite failure."""
    text = str(error)
    low = text.lower()
    if "locked" in low or "busy" in low:
        hint = (
            f"is locked by another process for longer than the busy timeout "
            f"({BUSY_TIMEOUT_SECONDS:g}s)"
        )
    elif "unable to open" in low:
        hint = "cannot be opened (does its directory exist, and may this user write it?)"
    elif "no such table" in low:
        hint = "is not migrated (run `runq migrate`)"
    elif "full" in low:
        hint = "cannot grow: the disk or the file system is full"
    elif "readonly" in low or "read-only" in low:
        hint = "is read-only for this process"
    elif "disk i/o" in low:
        hint = "had a disk I/O error"
    elif "not a database" in low or "malformed" in low:
        hint = "is not a usable SQLite database"
    elif "closed" in low:
        hint = "is closed (the store is not connected)"
    else:
        hint = "refused the operation"
    return StoreUnavailable(f"SQLite database {path} {hint}: {text}")


def _sorted_by_claim_order(rows: list[Row]) -> list[Row]:
    # RETURNING gives rows in no particular order; callers expect the claim order.
    return sorted(rows, key=lambda r: (r["priority"], r["available_at"], r["id"]))


class SqliteStore:
    """``Store`` on one SQLite file. ``schema`` is a table prefix (``{schema}_runs``)."""

    engine = "sqlite"
    supports_listen = False

    def __init__(self, path: Path, *, schema: str, sealer: Sealer) -> None:
        if not _SCHEMA_RE.match(schema):
            raise ConfigError("store.schema", f"{schema!r} must be a lower-case SQL identifier")
        self.path = Path(path)
        self.schema = schema
        self.clock_offset_seconds = 0.0
        self._sealer = sealer
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._runs = f"{schema}_runs"
        self._workers = f"{schema}_workers"
        self._usage = f"{schema}_budget_usage"
        self._migrations_table = f"{schema}_schema_migrations"
        self._build_sql()

    # -- SQL text, built once per store ---------------------------------------------------

    def _build_sql(self) -> None:
        t = self._runs
        lease_clear = "locked_by = NULL, locked_at = NULL"
        fence = "id = :id AND attempt = :attempt AND locked_by = :worker AND status = 'running'"
        self._sql_get = f"SELECT * FROM {t} WHERE id = ?"
        self._sql_by_key = (
            f"SELECT * FROM {t} WHERE idempotency_key = ? AND coalesce(user_id, '') = ?"
        )
        # Bounded: counting stops at the depth limit instead of scanning a huge backlog.
        self._sql_count_queued = (
            f"SELECT count(*) FROM (SELECT 1 FROM {t} WHERE status = 'queued' LIMIT ?)"
        )
        self._sql_insert = (
            f"INSERT INTO {t} (id, component_type, component_id, status, attempt, max_attempts,"
            " priority, session_id, user_id, actor, configuration, deployment_id,"
            " idempotency_key, origin, created_at, updated_at, available_at, has_request,"
            " payload) VALUES (:id, :component_type, :component_id, 'queued', 0, :max_attempts,"
            " :priority, :session_id, :user_id, :actor, :configuration, :deployment_id,"
            " :idempotency_key, :origin, :now, :now, :now + :delay, :has_request, :payload)"
        )
        self._sql_cancel_now = (
            f"UPDATE {t} SET status = 'cancelled', termination_reason = 'cancelled',"
            f" cancel_requested = 1, completed_at = :now, updated_at = :now, {lease_clear},"
            " resume_state = NULL, decision = NULL"
            f" WHERE id = :id AND status IN ({sql_status_list(TRANSITIONS['cancel'].sources)})"
            " RETURNING *"
        )
        self._sql_cancel_request = (
            f"UPDATE {t} SET cancel_requested = 1, updated_at = :now"
            " WHERE id = :id AND status = 'running' RETURNING *"
        )
        self._sql_continue = (
            f"UPDATE {t} SET status = 'queued', decision = :decision,"
            " max_attempts = attempt + 1, available_at = :now, continued_at = :now,"
            f" updated_at = :now, {lease_clear}"
            " WHERE id = :id AND status = 'paused' RETURNING *"
        )
        self._sql_requeue = (
            f"UPDATE {t} SET status = 'queued', max_attempts = attempt + 1,"
            " available_at = :now, updated_at = :now, error = NULL, termination_reason = NULL,"
            f" completed_at = NULL, {lease_clear}, non_idempotent = 0,"
            " cancel_requested = CASE WHEN :clear THEN 0 ELSE cancel_requested END"
            f" WHERE id = :id AND status IN ({sql_status_list(TRANSITIONS['requeue'].sources)})"
            " RETURNING *"
        )
        self._sql_heartbeat = (
            f"UPDATE {t} SET locked_at = :now"
            " FROM (SELECT json_extract(value, '$[0]') AS lid, json_extract(value, '$[1]') AS la"
            "       FROM json_each(:leases)) AS l"
            f" WHERE {t}.id = l.lid AND {t}.attempt = l.la"
            f" AND {t}.locked_by = :worker AND +{t}.status = 'running'"
            f" RETURNING {t}.id, {t}.attempt, {t}.cancel_requested"
        )
        self._sql_touch_worker = f"UPDATE {self._workers} SET last_seen_at = ? WHERE id = ?"
        self._sql_release = (
            f"UPDATE {t} SET status = 'queued', attempt = attempt - 1,"
            " started_at = CASE WHEN attempt = 1 THEN NULL ELSE started_at END,"
            f" error = coalesce(:error, error), updated_at = :now, {lease_clear}"
            f" WHERE {fence}"
        )
        self._sql_complete = (
            f"UPDATE {t} SET status = 'completed', answer = :answer,"
            " termination_reason = :reason, completed_at = :now, updated_at = :now,"
            f" {lease_clear}, resume_state = NULL, decision = NULL, non_idempotent = 0"
            f" WHERE {fence} RETURNING id"
        )
        # The retry rule of DESIGN §3 lives in the statement, so it is decided on the row
        # as it is at the moment of the write, not as the worker last saw it.
        retry = ":retryable AND attempt < max_attempts AND non_idempotent = 0"
        self._sql_fail = (
            f"UPDATE {t} SET"
            f" status = CASE WHEN {retry} THEN 'queued' ELSE 'failed' END,"
            f" available_at = CASE WHEN {retry} THEN :now + :delay ELSE available_at END,"
            f" termination_reason = CASE WHEN {retry} THEN NULL"
            "   WHEN NOT :retryable THEN 'not_retryable'"
            "   WHEN attempt >= max_attempts THEN 'retries_exhausted'"
            "   ELSE 'not_retryable' END,"  # attempts left, but inside a non-idempotent section
            f" completed_at = CASE WHEN {retry} THEN NULL ELSE :now END,"
            f" resume_state = CASE WHEN {retry} THEN resume_state ELSE NULL END,"
            f" decision = CASE WHEN {retry} THEN decision ELSE NULL END,"
            f" error = :error, updated_at = :now, {lease_clear}"
            f" WHERE {fence} RETURNING status"
        )
        self._sql_pause = (
            f"UPDATE {t} SET status = 'paused', pause_reason = :reason, resume_state = :state,"
            # continued_at marks "this pause was answered"; a new pause is unanswered.
            f" decision = NULL, continued_at = NULL, updated_at = :now, {lease_clear}"
            f" WHERE {fence} RETURNING id"
        )
        self._sql_settle_cancelled = (
            f"UPDATE {t} SET status = 'cancelled', termination_reason = 'cancelled',"
            f" completed_at = :now, updated_at = :now, {lease_clear},"
            " resume_state = NULL, decision = NULL"
            f" WHERE {fence} RETURNING id"
        )
        self._sql_non_idempotent = (
            f"UPDATE {t} SET non_idempotent = :inside WHERE {fence} RETURNING id"
        )
        self._sql_add_run_usage = (
            f"UPDATE {t} SET tokens = tokens + :tokens, cost = cost + :cost WHERE id = :id"
        )
        u = self._usage
        self._sql_usage_upsert = (
            f"INSERT INTO {u} (scope, subject, period_start, cost, tokens, runs)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (scope, subject, period_start) DO UPDATE SET"
            " cost = cost + excluded.cost, tokens = tokens + excluded.tokens,"
            " runs = runs + excluded.runs"
        )
        self._sql_usage_get = (
            f"SELECT cost, tokens, runs FROM {u}"
            " WHERE scope = ? AND subject = ? AND period_start = ?"
        )
        self._sql_reap = self._reap_sql()
        self._sql_purge_final = (
            f"DELETE FROM {t} WHERE id IN (SELECT id FROM {t} INDEXED BY {t}_final_idx"
            f" WHERE {_FINAL_IN} AND completed_at < :cutoff LIMIT :batch)"
        )
        self._sql_purge_paused = (
            f"DELETE FROM {t} WHERE id IN (SELECT id FROM {t} INDEXED BY {t}_paused_idx"
            " WHERE status = 'paused' AND updated_at < :cutoff LIMIT :batch)"
        )
        w = self._workers
        self._sql_register = (
            f"INSERT INTO {w} (id, hostname, pid, deployment_id, started_at, last_seen_at)"
            " VALUES (:id, :hostname, :pid, :deployment_id, :now, :now)"
            " ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname, pid = excluded.pid,"
            " deployment_id = excluded.deployment_id, last_seen_at = excluded.last_seen_at"
        )

    def _reap_sql(self) -> str:
        """DESIGN §6 as one statement: the rules are CASE arms in their order, and the WHERE
        rechecks staleness on the row itself, so a lease renewed meanwhile is left alone."""
        t = self._runs
        rule1 = "non_idempotent = 1"
        rule2 = "has_request = 0"
        rule3 = "attempt >= max_attempts"
        dead = f"({rule1} OR {rule2} OR {rule3})"
        stale = "status = 'running' AND locked_at < :now - :grace"
        recheck = "+status = 'running' AND +locked_at < :now - :grace"
        return (
            f"UPDATE {t} SET"
            f" status = CASE WHEN {dead} THEN 'failed' ELSE 'queued' END,"
            f" termination_reason = CASE WHEN {rule1} OR {rule2} THEN 'not_retryable'"
            f"   WHEN {rule3} THEN 'retries_exhausted' ELSE termination_reason END,"
            f" error = CASE WHEN {rule1} THEN :err_non_idempotent"
            f"   WHEN {rule2} THEN :err_no_request"
            f"   WHEN {rule3} THEN {common.reap_exhausted_error_sql()} ELSE error END,"
            f" completed_at = CASE WHEN {dead} THEN :now ELSE completed_at END,"
            f" available_at = CASE WHEN {dead} THEN available_at ELSE :now END,"
            f" resume_state = CASE WHEN {dead} THEN NULL ELSE resume_state END,"
            f" decision = CASE WHEN {dead} THEN NULL ELSE decision END,"
            " locked_by = NULL, locked_at = NULL, updated_at = :now"
            f" WHERE {recheck} AND id IN ("
            f"   SELECT id FROM {t} INDEXED BY {t}_lease_idx WHERE {stale}"
            "    ORDER BY locked_at, id LIMIT :limit)"
            " RETURNING id, status"
        )

    def _claim_sql(
        self, *, deployment: bool, sessions: bool, block: BudgetBlock | None, by_id: bool
    ) -> str:
        t = self._runs
        filters = ["r.status = 'queued'", "r.available_at <= :now"]
        if by_id:
            filters.append("r.id = :run_id")
        if sessions:
            # The session rule of DESIGN §3 in one probe of the active-session index: no
            # other active run of the session that is older, or that is running or paused.
            filters.append(
                f"(r.session_id IS NULL OR NOT EXISTS (SELECT 1 FROM {t} s"
                f" WHERE s.session_id = r.session_id AND s.{_ACTIVE_IN} AND s.id <> r.id"
                " AND (s.id < r.id OR s.status <> 'queued')))"
            )
        if block is not None and block.users:
            filters.append("coalesce(r.user_id, '') NOT IN (SELECT value FROM json_each(:bu))")
        if block is not None and block.configurations:
            filters.append(
                "coalesce(r.configuration, '') NOT IN (SELECT value FROM json_each(:bc))"
            )
        if block is not None and block.pairs:
            filters.append(
                "NOT EXISTS (SELECT 1 FROM json_each(:bp) p"
                " WHERE json_extract(p.value, '$[0]') = coalesce(r.user_id, '')"
                " AND json_extract(p.value, '$[1]') = coalesce(r.configuration, ''))"
            )
        where = " AND ".join(filters)
        order = "ORDER BY r.priority, r.available_at, r.id LIMIT :slots"

        def branch(dep: str) -> str:
            return (
                f"SELECT r.id, r.priority, r.available_at FROM {t} r{walk}"
                f" WHERE r.deployment_id = {dep} AND {where} {order}"
            )

        no_dep = "''"
        # Walk the claim index in claim order so LIMIT stops early; one run by id is a
        # primary-key lookup instead.
        walk = "" if by_id else f" INDEXED BY {t}_claim_idx"
        if deployment:
            # Two ordered index walks (no deployment, ours) merged, instead of one IN that
            # would sort every claimable row to find the first few.
            candidates = (
                f"SELECT id FROM (SELECT * FROM ({branch(no_dep)})"
                f" UNION ALL SELECT * FROM ({branch(':dep')}))"
                " ORDER BY priority, available_at, id LIMIT :slots"
            )
        else:
            candidates = f"SELECT id FROM ({branch(no_dep)})"
        return (
            f"UPDATE {t} SET status = 'running', attempt = attempt + 1, locked_by = :worker,"
            " locked_at = :now, started_at = :now, updated_at = :now"
            # ``+status``: the recheck must not tempt the planner away from the id lookup.
            f" WHERE +status = 'queued' AND id IN ({candidates}) RETURNING *"
        )

    # -- plumbing -------------------------------------------------------------------------

    async def _call(self, conn: aiosqlite.Connection | None, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the connection's thread; map SQLite failures to StoreUnavailable."""
        if conn is None:
            raise StoreUnavailable(f"SQLite database {self.path}: the store is not connected")
        try:
            # aiosqlite's own queue-to-thread primitive: one hop for a whole transaction.
            result: T = await conn._execute(fn)  # type: ignore[no-untyped-call]
        except (sqlite3.IntegrityError, sqlite3.InterfaceError):
            raise  # a bug in a statement, not an unavailable database
        except sqlite3.ProgrammingError as e:
            if "closed" in str(e).lower():
                raise _unavailable(self.path, e) from e
            raise
        except sqlite3.DatabaseError as e:
            raise _unavailable(self.path, e) from e
        except ValueError as e:
            if "closed" in str(e).lower() or "no active connection" in str(e).lower():
                raise _unavailable(self.path, e) from e
            raise
        return result

    async def _write(self, body: Body[T]) -> T:
        """One BEGIN IMMEDIATE transaction on the writer; ``body(conn, now)``."""
        offset = self.clock_offset_seconds
        return await self._call(
            self._writer, lambda: _in_transaction(self._sqlite(self._writer), body, offset)
        )

    async def _read(self, body: Body[T]) -> T:
        """A consistent read on the reader connection; ``body(conn, now)``."""
        offset = self.clock_offset_seconds
        return await self._call(
            self._reader, lambda: _in_snapshot(self._sqlite(self._reader), body, offset)
        )

    async def _read_one(self, sql: str, params: Sequence[Any]) -> Row | None:
        def run() -> Row | None:
            row: Row | None = self._sqlite(self._reader).execute(sql, params).fetchone()
            return row

        return await self._call(self._reader, run)

    @staticmethod
    def _sqlite(conn: aiosqlite.Connection | None) -> sqlite3.Connection:
        assert conn is not None
        raw: sqlite3.Connection = conn._conn
        return raw

    def _run(self, row: Row) -> Run:
        return common.row_to_run(row, self._sealer)

    # -- lifecycle ------------------------------------------------------------------------

    async def connect(self) -> None:
        if self._writer is not None:
            return
        writer = await self._open(query_only=False)
        try:
            reader = await self._open(query_only=True)
        except BaseException:
            await writer.close()
            raise
        self._writer, self._reader = writer, reader

    async def _open(self, *, query_only: bool) -> aiosqlite.Connection:
        conn = aiosqlite.connect(
            self.path,
            isolation_level=None,  # explicit transactions only: we say BEGIN IMMEDIATE
            timeout=BUSY_TIMEOUT_SECONDS,
            cached_statements=256,
        )
        # aiosqlite's thread is not a daemon: a process that dies without closing the store
        # (a crash, an unhandled error) would hang at exit instead of letting its supervisor
        # restart it. Exiting mid-transaction is safe: SQLite treats it as a crash (WAL).
        conn._thread.daemon = True
        try:
            await conn
        except sqlite3.Error as e:
            # aiosqlite stops its thread on a failed open without waiting for it; wait here,
            # while the event loop still runs, so the thread never reports to a closed loop.
            await asyncio.to_thread(conn._thread.join, BUSY_TIMEOUT_SECONDS)
            raise _unavailable(self.path, e) from e
        conn.row_factory = sqlite3.Row
        try:
            pragmas = [
                f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}",
                "PRAGMA journal_mode = WAL",  # readers never block the writer, nor it them
                "PRAGMA synchronous = NORMAL",  # durable across process crashes in WAL mode
                "PRAGMA temp_store = MEMORY",
            ]
            if query_only:
                pragmas.append("PRAGMA query_only = 1")

            def apply() -> None:
                raw = conn._conn
                for pragma in pragmas:
                    raw.execute(pragma).fetchall()

            await self._call(conn, apply)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def close(self) -> None:
        writer, reader = self._writer, self._reader
        self._writer = self._reader = None
        for conn in (reader, writer):
            if conn is not None:
                # Closing is best effort; the file stays consistent either way (WAL).
                with contextlib.suppress(sqlite3.Error):
                    await conn.close()

    async def migrate(self) -> int:
        m = self._migrations_table
        await self._write(
            lambda conn, now: conn.execute(
                f"CREATE TABLE IF NOT EXISTS {m}"
                " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
        )
        applied = 0
        for migration in _migrations():
            # One IMMEDIATE transaction per migration, re-checking inside it: a replica that
            # started at the same moment and won the lock has already applied it.
            if await self._write(functools.partial(self._apply_migration, migration)):
                applied += 1
        return applied

    def _apply_migration(
        self, migration: common.Migration, conn: sqlite3.Connection, now: float
    ) -> bool:
        m = self._migrations_table
        if conn.execute(f"SELECT 1 FROM {m} WHERE version = ?", (migration.version,)).fetchone():
            return False
        for statement in common.split_sql(migration.sql.replace("{schema}", self.schema)):
            conn.execute(statement)
        conn.execute(
            f"INSERT INTO {m} (version, name, applied_at) VALUES (?, ?, ?)",
            (migration.version, migration.name, now),
        )
        return True

    async def schema_is_current(self) -> bool:
        m = self._migrations_table

        def body(conn: sqlite3.Connection, now: float) -> set[int]:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (m,)
            ).fetchone()
            if not exists:
                return set()
            return {row[0] for row in conn.execute(f"SELECT version FROM {m}")}

        applied = await self._read(body)
        return {mig.version for mig in _migrations()} <= applied

    async def ping(self) -> None:
        await self._read_one("SELECT 1", ())

    async def now(self) -> float:
        row = await self._read_one(_NOW_SQL, (self.clock_offset_seconds,))
        assert row is not None
        value: float = row[0]
        return value

    # -- producer -------------------------------------------------------------------------

    def _insert_params(self, new: NewRun, run_id: str, encoded: bytes | None) -> dict[str, Any]:
        return {
            "id": run_id,
            "component_type": new.component_type,
            "component_id": new.component_id,
            "max_attempts": new.max_attempts,
            "priority": new.priority,
            "session_id": new.session_id,
            "user_id": new.actor.user_id,
            "actor": common.encode_actor(new.actor),
            "configuration": new.configuration,
            "deployment_id": new.deployment_id or "",
            "idempotency_key": new.idempotency_key,
            "origin": new.origin,
            "delay": max(float(new.delay_seconds), 0.0),
            "has_request": 1 if new.save_request else 0,
            "payload": common.seal_encoded(self._sealer, "payload", run_id, encoded),
        }

    async def submit(
        self, new: NewRun, *, max_queue_depth: int, wake: bool = False
    ) -> SubmitResult:
        # ``wake`` asks for an in-statement NOTIFY; SQLite has none (claimers poll or are
        # woken in process), so it is ignored.
        run_id = new.id or new_run_id()
        # Encode (and seal) before the transaction: a bad payload never takes the write lock.
        encoded = common.encode_json(new.payload) if new.save_request else None
        params = self._insert_params(new, run_id, encoded)
        key, user = new.idempotency_key, new.actor.user_id or ""

        def body(conn: sqlite3.Connection, now: float) -> tuple[Row | None, float]:
            if key is not None:
                existing: Row | None = conn.execute(self._sql_by_key, (key, user)).fetchone()
                if existing is not None:
                    if (existing["component_type"], existing["component_id"]) != (
                        new.component_type,
                        new.component_id,
                    ):
                        component = f"{existing['component_type']}/{existing['component_id']}"
                        raise IdempotencyConflict(common.idempotency_conflict(key, component))
                    return existing, now
            if max_queue_depth > 0:
                queued = conn.execute(self._sql_count_queued, (max_queue_depth,)).fetchone()[0]
                if queued >= max_queue_depth:
                    raise QueueFull(common.queue_full(max_queue_depth))
            params["now"] = now
            try:
                conn.execute(self._sql_insert, params)
            except sqlite3.IntegrityError as e:
                raise Conflict(f"run {run_id} already exists") from e
            return None, now

        existing, now = await self._write(body)
        if existing is not None:
            return SubmitResult(self._run(existing), created=False)
        return SubmitResult(self._fresh_run(new, run_id, encoded, params, now), created=True)

    @staticmethod
    def _fresh_run(
        new: NewRun, run_id: str, encoded: bytes | None, params: dict[str, Any], now: float
    ) -> Run:
        """The inserted row as a Run, built from what we wrote (no read-back, no unsealing)."""
        return Run(
            id=run_id,
            component_type=new.component_type,
            component_id=new.component_id,
            status=Status.QUEUED,
            attempt=0,
            max_attempts=new.max_attempts,
            priority=new.priority,
            session_id=new.session_id,
            user_id=new.actor.user_id,
            actor=new.actor,
            configuration=new.configuration,
            deployment_id=new.deployment_id or None,
            idempotency_key=new.idempotency_key,
            origin=new.origin,
            created_at=now,
            updated_at=now,
            available_at=now + params["delay"],
            started_at=None,
            completed_at=None,
            locked_by=None,
            locked_at=None,
            error=None,
            termination_reason=None,
            pause_reason=None,
            cancel_requested=False,
            non_idempotent=False,
            has_request=new.save_request,
            payload=msgspec.json.decode(encoded) if encoded is not None else None,
        )

    async def submit_many(self, news: Sequence[NewRun]) -> list[str]:
        ids = [new.id or new_run_id() for new in news]
        rows = [
            self._insert_params(
                new, run_id, common.encode_json(new.payload) if new.save_request else None
            )
            for new, run_id in zip(news, ids, strict=True)
        ]

        def body(conn: sqlite3.Connection, now: float) -> None:
            for row in rows:
                row["now"] = now
            try:
                conn.executemany(self._sql_insert, rows)
            except sqlite3.IntegrityError as e:
                raise Conflict(f"bulk insert refused (duplicate id or idempotency key): {e}") from e

        if rows:
            await self._write(body)
        return ids

    async def get(self, run_id: str) -> Run | None:
        row = await self._read_one(self._sql_get, (run_id,))
        return self._run(row) if row is not None else None

    async def cancel(self, run_id: str) -> Run:
        def body(conn: sqlite3.Connection, now: float) -> Row:
            params = {"id": run_id, "now": now}
            row: Row | None = conn.execute(self._sql_cancel_now, params).fetchone()
            if row is None:
                row = conn.execute(self._sql_cancel_request, params).fetchone()
            if row is None:
                row = conn.execute(self._sql_get, (run_id,)).fetchone()
                if row is None:
                    raise NotFound(common.not_found(run_id))
                if row["status"] != Status.CANCELLED:
                    raise Conflict(common.cancel_refused(run_id, row["status"]))
            return row

        return self._run(await self._write(body))

    async def continue_(self, run_id: str, decision: Any) -> Run:
        sealed = common.seal_json(self._sealer, "decision", run_id, decision)

        def body(conn: sqlite3.Connection, now: float) -> Row:
            params = {"id": run_id, "now": now, "decision": sealed}
            row: Row | None = conn.execute(self._sql_continue, params).fetchone()
            if row is not None:
                return row
            row = conn.execute(self._sql_get, (run_id,)).fetchone()
            if row is None:
                raise NotFound(common.not_found(run_id))
            # A repeated continue of the same pause: its continuation is queued or running.
            if (
                row["status"] in (Status.QUEUED, Status.RUNNING)
                and row["continued_at"] is not None
                and row["decision"] is not None
            ):
                return row
            raise Conflict(common.continue_refused(run_id, row["status"]))

        return self._run(await self._write(body))

    async def requeue(
        self, run_id: str, *, clear_cancellation: bool, force: bool, lock_grace_seconds: float
    ) -> Run:
        def body(conn: sqlite3.Connection, now: float) -> Row:
            row: Row | None = conn.execute(self._sql_get, (run_id,)).fetchone()
            if row is None:
                raise NotFound(common.not_found(run_id))
            status = row["status"]
            if status not in (Status.FAILED, Status.CANCELLED):
                raise InvalidTransition(common.requeue_refused(run_id, status))
            completed_at = row["completed_at"]
            if (
                status == Status.FAILED
                and not force
                and completed_at is not None
                and completed_at > now - lock_grace_seconds
            ):
                raise Conflict(common.requeue_too_soon(run_id, lock_grace_seconds))
            params = {"id": run_id, "now": now, "clear": 1 if clear_cancellation else 0}
            updated: Row = conn.execute(self._sql_requeue, params).fetchone()
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
    ) -> list[Run]:
        if slots <= 0:
            return []
        block = blocked if blocked is not None and not blocked.empty else None
        sql = self._claim_sql(
            deployment=bool(deployment_id),
            sessions=serialize_sessions,
            block=block,
            by_id=run_id is not None,
        )
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
            params["now"] = now
            return conn.execute(sql, params).fetchall()

        # The transaction runs on the connection thread and finishes even if this coroutine
        # is cancelled meanwhile (a shutdown). Its runs would then sit "running" under a
        # lease nobody holds until the reaper dead-letters them, so give them back instead.
        task = asyncio.ensure_future(self._write(body))
        try:
            rows = await asyncio.shield(task)
        except asyncio.CancelledError:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await self._release(worker_id, await task, error=None)
            raise
        return await self._open_claimed(worker_id, _sorted_by_claim_order(rows))

    async def _open_claimed(self, worker_id: str, rows: list[Row]) -> list[Run]:
        """Decode claimed rows. A run whose sealed values do not open is given back (queued,
        attempt restored) with the reason in ``error``, so one bad row neither strands the
        batch nor gets dead-lettered by a replica holding the wrong key."""
        runs: list[Run] = []
        broken: list[tuple[Row, SealError]] = []
        for row in rows:
            try:
                runs.append(self._run(row))
            except SealError as e:
                broken.append((row, e))
        for row, error in broken:
            await self._release(worker_id, [row], error=f"not executed: {error}")
        if broken and not runs:
            raise broken[0][1]
        return runs

    async def _release(self, worker_id: str, rows: Sequence[Row], *, error: str | None) -> None:
        """Undo a claim (fenced on the lease it took): queued again, attempt restored."""
        if not rows:
            return
        batch = [
            {"id": r["id"], "attempt": r["attempt"], "worker": worker_id, "error": error}
            for r in rows
        ]

        def body(conn: sqlite3.Connection, now: float) -> None:
            for params in batch:
                conn.execute(self._sql_release, {**params, "now": now})

        await self._write(body)

    async def heartbeat_many(self, worker_id: str, leases: Sequence[Lease]) -> HeartbeatResult:
        lease_json = _json.encode(list(leases)).decode()

        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            conn.execute(self._sql_touch_worker, (now, worker_id))
            if not leases:
                return []
            params = {"now": now, "worker": worker_id, "leases": lease_json}
            return conn.execute(self._sql_heartbeat, params).fetchall()

        rows = await self._write(body)
        renewed = {(row[0], row[1]) for row in rows}
        return HeartbeatResult(
            renewed=tuple(lease for lease in leases if (lease.run_id, lease.attempt) in renewed),
            lost=tuple(lease for lease in leases if (lease.run_id, lease.attempt) not in renewed),
            cancel_requested=tuple(row[0] for row in rows if row[2]),
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
                "answer": (
                    common.seal_json(self._sealer, "answer", c.run_id, c.answer)
                    if c.keep_answer
                    else None
                ),
            }
            for c in completions
        ]

        def body(conn: sqlite3.Connection, now: float) -> list[str]:
            # One transaction, one prepared statement executed per run (no round trips):
            # each write is fenced on its own row, so one lost lease fences only itself.
            applied: list[str] = []
            for params in batch:
                params["now"] = now
                if conn.execute(self._sql_complete, params).fetchone() is not None:
                    applied.append(params["id"])
            return applied

        applied = await self._write(body)
        done = set(applied)
        return FenceResult(
            applied=tuple(applied),
            fenced_off=tuple(c.run_id for c in completions if c.run_id not in done),
        )

    async def _fenced(self, sql: str, worker_id: str, lease: Lease, **extra: Any) -> Row | None:
        params: dict[str, Any] = {
            "id": lease.run_id,
            "attempt": lease.attempt,
            "worker": worker_id,
            **extra,
        }

        def body(conn: sqlite3.Connection, now: float) -> Row | None:
            params["now"] = now
            row: Row | None = conn.execute(sql, params).fetchone()
            return row

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
        row = await self._fenced(
            self._sql_fail,
            worker_id,
            lease,
            error=error,
            retryable=1 if retryable else 0,
            delay=max(float(retry_in_seconds), 0.0),
        )
        if row is None:
            return FailOutcome.FENCED_OFF
        if row[0] == Status.QUEUED:
            return FailOutcome.RETRY_SCHEDULED
        return FailOutcome.DEAD_LETTERED

    async def pause(self, worker_id: str, lease: Lease, *, reason: str, state: Any) -> bool:
        sealed = common.seal_json(self._sealer, "resume_state", lease.run_id, state)
        row = await self._fenced(self._sql_pause, worker_id, lease, reason=reason, state=sealed)
        return row is not None

    async def settle_cancelled(self, worker_id: str, lease: Lease) -> bool:
        return await self._fenced(self._sql_settle_cancelled, worker_id, lease) is not None

    async def set_non_idempotent(self, worker_id: str, lease: Lease, inside: bool) -> bool:
        row = await self._fenced(
            self._sql_non_idempotent, worker_id, lease, inside=1 if inside else 0
        )
        return row is not None

    async def record_usage(
        self, worker_id: str, lease: Lease, *, tokens: int, cost: float, keys: Sequence[UsageKey]
    ) -> None:
        counters = [(k.scope, k.subject, k.period_start, cost, tokens, 0) for k in keys]

        def body(conn: sqlite3.Connection, now: float) -> None:
            # Unfenced on purpose: the tokens were spent whether or not the lease survived.
            conn.execute(
                self._sql_add_run_usage, {"id": lease.run_id, "tokens": tokens, "cost": cost}
            )
            if counters:
                conn.executemany(self._sql_usage_upsert, counters)

        await self._write(body)

    async def count_claimed_run(self, keys: Sequence[UsageKey]) -> None:
        if not keys:
            return
        counters = [(k.scope, k.subject, k.period_start, 0.0, 0, 1) for k in keys]
        await self._write(lambda conn, now: conn.executemany(self._sql_usage_upsert, counters))

    async def usage_totals(self, keys: Sequence[UsageKey]) -> dict[UsageKey, UsageTotals]:
        def body(conn: sqlite3.Connection, now: float) -> dict[UsageKey, UsageTotals]:
            totals: dict[UsageKey, UsageTotals] = {}
            for key in keys:
                row = conn.execute(
                    self._sql_usage_get, (key.scope, key.subject, key.period_start)
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
        sql = (
            f"SELECT scope, subject, period_start, cost, tokens, runs FROM {self._usage}"
            " WHERE scope = ? AND period_start = ?"
        )

        def body(conn: sqlite3.Connection, now: float) -> dict[UsageKey, UsageTotals]:
            # One primary-key range probe per period; a gate asks for a handful of periods.
            found: dict[UsageKey, UsageTotals] = {}
            for scope, period_start in dict.fromkeys(periods):
                for row in conn.execute(sql, (scope, period_start)):
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
            "err_non_idempotent": common.REAP_NON_IDEMPOTENT_ERROR,
            "err_no_request": common.REAP_NO_REQUEST_ERROR,
        }

        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            params["now"] = now
            return conn.execute(self._sql_reap, params).fetchall()

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

    async def purge_final_before(
        self,
        *,
        retention_seconds: float,
        paused_retention_seconds: float,
        batch_size: int = 500,
        max_batches: int = 1000,
    ) -> PurgeReport:
        report = PurgeReport()
        batch_size = max(int(batch_size), 1)

        passes = [(self._sql_purge_final, retention_seconds)]
        if paused_retention_seconds > 0:  # 0 = paused runs wait until decided
            passes.append((self._sql_purge_paused, paused_retention_seconds))
        for sql, age in passes:
            body = functools.partial(self._purge_batch, sql, age, batch_size)
            # One short transaction per batch, so other processes get the write lock between.
            while report.batches < max_batches:
                deleted = await self._write(body)
                if deleted:
                    report.deleted += deleted
                    report.batches += 1
                if deleted < batch_size:
                    break
        return report

    @staticmethod
    def _purge_batch(
        sql: str, age: float, batch_size: int, conn: sqlite3.Connection, now: float
    ) -> int:
        deleted: int = conn.execute(sql, {"cutoff": now - age, "batch": batch_size}).rowcount
        return deleted

    async def register_worker(self, info: WorkerInfo) -> None:
        params = {
            "id": info.id,
            "hostname": info.hostname,
            "pid": info.pid,
            "deployment_id": info.deployment_id or "",
        }

        def body(conn: sqlite3.Connection, now: float) -> None:
            conn.execute(self._sql_register, {**params, "now": now})

        await self._write(body)

    async def remove_worker(self, worker_id: str) -> None:
        await self._write(
            lambda conn, now: conn.execute(
                f"DELETE FROM {self._workers} WHERE id = ?", (worker_id,)
            )
        )

    async def prune_workers(self, *, max_age_seconds: float) -> int:
        def body(conn: sqlite3.Connection, now: float) -> int:
            sql = f"DELETE FROM {self._workers} WHERE last_seen_at < ?"
            count: int = conn.execute(sql, (now - max_age_seconds,)).rowcount
            return count

        return await self._write(body)

    async def list_workers(self, *, max_age_seconds: float) -> list[WorkerInfo]:
        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            return conn.execute(
                f"SELECT * FROM {self._workers} WHERE last_seen_at >= ? ORDER BY started_at, id",
                (now - max_age_seconds,),
            ).fetchall()

        return [
            WorkerInfo(
                id=row["id"],
                hostname=row["hostname"],
                pid=row["pid"],
                deployment_id=row["deployment_id"] or None,
                started_at=row["started_at"],
                last_seen_at=row["last_seen_at"],
            )
            for row in await self._read(body)
        ]

    # -- reads for operators --------------------------------------------------------------

    def _counts(self, conn: sqlite3.Connection) -> dict[str, int]:
        sql = f"SELECT status, count(*) FROM {self._runs} GROUP BY status"
        return {row[0]: row[1] for row in conn.execute(sql)}

    def _oldest_queued(self, conn: sqlite3.Connection, now: float) -> dict[str, float]:
        """Oldest claimable-since time per deployment; a delayed run is not waiting yet."""
        sql = (
            f"SELECT deployment_id, min(available_at) FROM {self._runs}"
            f" INDEXED BY {self._runs}_claim_idx"  # covering: no table lookups
            " WHERE status = 'queued' AND available_at <= ? GROUP BY deployment_id"
        )
        return {row[0]: max(now - row[1], 0.0) for row in conn.execute(sql, (now,))}

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
                f"SELECT count(*) FROM {self._runs} INDEXED BY {self._runs}_lease_idx"
                " WHERE status = 'running' AND locked_at < ?",
                (now - lock_grace_seconds,),
            ).fetchone()[0]
            live = conn.execute(
                f"SELECT count(*) FROM {self._workers} WHERE last_seen_at >= ?",
                (now - worker_max_age_seconds,),
            ).fetchone()[0]
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
        filters: list[str] = []
        params: list[Any] = []
        if statuses:
            filters.append(f"status IN ({', '.join('?' for _ in statuses)})")
            params.extend(str(Status(s)) for s in statuses)
        if user_id is not None:
            filters.append("user_id = ?")
            params.append(user_id)
        where = f" WHERE {' AND '.join(filters)}" if filters else ""
        order = common.order_by_sql(sort_by, sort_order)
        page_sql = f"SELECT * FROM {self._runs}{where} ORDER BY {order} LIMIT ? OFFSET ?"
        count_sql = f"SELECT count(*) FROM {self._runs}{where}"

        def body(conn: sqlite3.Connection, now: float) -> tuple[int, list[Row]]:
            total: int = conn.execute(count_sql, params).fetchone()[0]
            rows = conn.execute(page_sql, [*params, limit, (page - 1) * limit]).fetchall()
            return total, rows

        total, rows = await self._read(body)
        return Page(data=[self._run(r) for r in rows], page=page, limit=limit, total_count=total)

    async def reseal_page(self, *, after_id: str, limit: int) -> tuple[str | None, int]:
        columns = ", ".join(SEALED_COLUMNS)
        rows = await self._read(
            lambda conn, now: conn.execute(
                f"SELECT id, {columns} FROM {self._runs} WHERE id > ? ORDER BY id LIMIT ?",
                (after_id, max(int(limit), 1)),
            ).fetchall()
        )
        if not rows:
            return None, 0
        sealing = self._sealer.sealing_key_id
        # (column, new value, id, old value): opened and re-sealed outside the write lock.
        updates: list[tuple[str, bytes, str, bytes]] = []
        for row in rows:
            for column in SEALED_COLUMNS:
                old = row[column]
                if old is not None and sealed_key_id(bytes(old)) != sealing:
                    opened = self._sealer.open(column, row["id"], bytes(old))
                    updates.append(
                        (column, self._sealer.seal(column, row["id"], opened), row["id"], old)
                    )

        def body(conn: sqlite3.Connection, now: float) -> int:
            # Compare-and-set on the old value: a column rewritten meanwhile (an answer
            # stored by a completion) is already under the new key and is left alone.
            count = 0
            for column, new, run_id, old in updates:
                sql = f"UPDATE {self._runs} SET {column} = ? WHERE id = ? AND {column} = ?"
                count += conn.execute(sql, (new, run_id, old)).rowcount
            return count

        resealed = await self._write(body) if updates else 0
        last: str = rows[-1]["id"]
        return last, resealed

    async def count_runs(self) -> int:
        row = await self._read_one(f"SELECT count(*) FROM {self._runs}", ())
        assert row is not None
        count: int = row[0]
        return count


__all__ = ["SqliteStore"]
