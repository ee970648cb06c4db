"""PostgreSQL engine: an asyncpg pool, ``FOR UPDATE SKIP LOCKED`` claims, batched writes.

Every verb is one statement (a few CTEs at most) so each costs one round trip and its
affected rows decide races. The statement texts are in ``statements``, the pool and its
error policy in ``connection``; this module binds parameters and maps rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import anyio
import asyncpg

from runq.errors import (
    Conflict,
    IdempotencyConflict,
    InvalidTransition,
    NotFound,
    QueueFull,
    StoreUnavailable,
)
from runq.flow import FlowRules, FlowState, Pause, like_pattern, split_running
from runq.model import (
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
from runq.store.migration_files import load_migrations
from runq.store.postgres import statements as pg_sql
from runq.store.postgres.connection import Pool
from runq.store.statements import check_schema

__all__ = ["PostgresStore"]

#: How many rows one submit_many statement carries; larger batches just take more statements.
#: The claim path's own connections (opened on the first claim): one claimer per replica,
#: plus one for a ``sync`` claim of a single run beside it.
CLAIM_CONNECTIONS = 2
#: How often submit re-runs after losing an idempotency race (the winner is then visible).
_SUBMIT_ATTEMPTS = 3


def _running(found: Sequence[Any]) -> tuple[float, list[tuple[str, str | None, int]]]:
    """(the clock, running counts) from ``running_by_component``: its first row carries
    the clock and no component."""
    now = next(float(r["now"]) for r in found if r["component"] is None)
    return now, [
        (r["component"], r["concurrency_key"], r["n"]) for r in found if r["component"] is not None
    ]


def _blocked_params(blocked: BudgetBlock | None) -> list[list[str]]:
    """The four text[] parameters of the budget exclusion (empty arrays exclude nothing)."""
    if blocked is None or blocked.empty:
        return [[], [], [], []]
    pairs = sorted(blocked.pairs)
    return [
        sorted(blocked.users),
        sorted(blocked.configurations),
        [u for u, _ in pairs],
        [c for _, c in pairs],
    ]


def _key_arrays(keys: Sequence[UsageKey]) -> tuple[list[str], list[str], list[float]]:
    return [k.scope for k in keys], [k.subject for k in keys], [k.period_start for k in keys]


def _counts(statuses: list[str] | None, ns: list[int] | None) -> dict[str, int]:
    return dict(zip(statuses or [], ns or [], strict=True))


class PostgresStore:
    """The ``Store`` protocol on PostgreSQL, one schema per installation.

    ``min_size``/``max_size`` bound the asyncpg pool; ``command_timeout`` bounds every
    statement (a timeout is ``StoreUnavailable``); ``migration_timeout`` replaces it for
    migration DDL; ``application_name`` shows in ``pg_stat_activity``.
    """

    engine = "postgres"
    supports_listen = True

    def __init__(
        self,
        url: str,
        *,
        schema: str,
        sealer: Sealer,
        min_size: int = 1,
        max_size: int = 10,
        command_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        migration_timeout: float = 3600.0,
        application_name: str = "runq",
        pgbouncer: bool = False,
        listen_url: str = "",
    ) -> None:
        self.url = url
        self._pgbouncer = pgbouncer
        self._listen_url = listen_url
        self.schema = check_schema(schema)
        self.clock_offset_seconds = 0.0
        #: ``[limits]`` applied by this process's claims (set by ``open_store``).
        self.flow = FlowRules()
        self._sealer = sealer
        self._migration_timeout = migration_timeout
        self._db = Pool(
            url,
            min_size=min_size,
            max_size=max_size,
            command_timeout=command_timeout,
            connect_timeout=connect_timeout,
            application_name=application_name,
            pooled=pgbouncer,
        )
        # Claims on a connection of their own: a wake-up's claim never queues behind
        # completion writes and heartbeats on the shared pool (the start-latency tail).
        self._claims = Pool(
            url,
            min_size=1,
            max_size=CLAIM_CONNECTIONS,
            command_timeout=command_timeout,
            connect_timeout=connect_timeout,
            application_name=f"{application_name} claims",
            pooled=pgbouncer,
        )
        self._claims_opening = asyncio.Lock()
        self._sql_offset = 0.0
        self._sql_cache = pg_sql.build(schema, 0.0)

    # -- plumbing -----------------------------------------------------------------------

    @property
    def channel(self) -> str:
        """The NOTIFY channel of this installation (one per schema)."""
        return f"runq_{self.schema}"

    @property
    def statements(self) -> pg_sql.Statements:
        """The statement texts this store prepares (also read by bench/explain_claim.py)."""
        # Tests move the clock by assigning clock_offset_seconds; rebuild the texts then.
        if self.clock_offset_seconds != self._sql_offset:
            self._sql_offset = self.clock_offset_seconds
            self._sql_cache = pg_sql.build(self.schema, self._sql_offset)
        return self._sql_cache

    #: The short name the verbs use.
    _sql = statements

    def _run(self, row: Any) -> Run:
        return rows.row_to_run(row, self._sealer)

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def listen_url(self) -> str | None:
        """Where LISTEN connects: ``[store] listen_url``, else the store URL unless behind
        PgBouncer (a pooled server connection cannot hold a LISTEN): None, poll only."""
        if self._listen_url:
            return self._listen_url
        return None if self._pgbouncer else self.url

    async def connect(self) -> None:
        await self._db.connect()

    async def _claim_pool(self) -> Pool:
        # Opened on the first claim: a replica that serves only the API, and every CLI
        # command, never holds these connections.
        if not self._claims.connected:
            async with self._claims_opening:
                await self._claims.connect()
        return self._claims

    async def close(self) -> None:
        try:
            await self._claims.close()
        finally:
            await self._db.close()

    async def migrate(self) -> int:
        """Apply pending migrations in one transaction under a per-schema advisory lock."""
        sql, timeout = self._sql, self._migration_timeout
        async with self._db.transaction() as con:
            await con.execute(sql.migrate_lock, self.schema)
            await con.execute(sql.create_schema, timeout=timeout)
            await con.execute(sql.create_migrations_table)
            done = {r["version"] for r in await con.fetch(sql.applied_versions)}
            applied = 0
            for m in load_migrations("postgres"):
                if m.version in done:
                    continue
                await con.execute(m.sql.replace("{schema}", self.schema), timeout=timeout)
                await con.execute(sql.record_migration, m.version, m.name)
                applied += 1
            return applied

    async def check_seal_key(self) -> str | None:
        mine = self._sealer.sealing_key_id.hex()
        async with self._db.transaction() as con:
            recorded: str | None = await con.fetchval(self._sql.seal_check_get)
            if recorded is not None and not self._sealer.has_key(bytes.fromhex(recorded)):
                return recorded
            if recorded != mine:
                await con.execute(self._sql.seal_check_put, mine)
        return None

    async def schema_is_current(self) -> bool:
        wanted = {m.version for m in load_migrations("postgres")}
        sql = self._sql

        async def read(pool: asyncpg.Pool) -> set[int]:
            async with pool.acquire() as con:
                if await con.fetchval(sql.migrations_table_exists) is False:
                    return set()
                return {r["version"] for r in await con.fetch(sql.applied_versions)}

        return wanted <= await self._db.call(read, retry=True)

    async def ping(self) -> None:
        await self._db.fetchval(self._sql.ping, retry=True)

    async def now(self) -> float:
        value: float = await self._db.fetchval(self._sql.now, retry=True)
        return value

    async def notify(self, payload: str) -> None:
        """NOTIFY this installation's channel (the postgres transport's wake-up)."""
        await self._db.fetchval(self._sql.notify, self.channel, payload)

    # -- producer -----------------------------------------------------------------------

    async def submit(
        self,
        new: NewRun,
        *,
        max_queue_depth: int,
        wake: bool = False,
        max_delayed: int = 0,
        max_queued_per_user: int = 0,
    ) -> SubmitResult:
        run_id = new.id or new_run_id()
        # Encode before any SQL: a value that is not JSON raises InvalidPayload, nothing written.
        values = rows.insert_values(new, run_id, self._sealer, rows.encoded_payload(new))
        args = (
            *values,
            max(max_queue_depth, 0),
            self.channel if wake else None,
            new.concurrency_key,
            max(max_delayed, 0),
            max(max_queued_per_user, 0),
        )
        if new.unique is not None:
            return await self._submit_unique(new, args, max_queue_depth)
        return await self._submit_row(new, args, max_queue_depth, self._db)

    async def _submit_row(
        self, new: NewRun, args: Sequence[Any], max_queue_depth: int, db: Any
    ) -> SubmitResult:
        """The submit statement on ``db`` (the pool, or a connection inside a transaction);
        ``args`` as ``_submit_sql`` numbers them."""
        run_id = args[0]
        delay, max_delayed, max_queued_per_user = args[12], args[18], args[19]
        for _ in range(_SUBMIT_ATTEMPTS):
            try:
                row = await db.fetchrow(self._sql.submit, *args)
            except asyncpg.UniqueViolationError as e:  # the primary key: an explicit id reused
                raise Conflict(messages.run_exists(run_id)) from e
            if row["id"] is not None:
                return SubmitResult(self._run(row), True)
            if row["existing_id"] is not None:
                return await self._existing(new, row["existing_id"], row["existing_component"])
            if row["user_full"]:
                raise QueueFull(messages.user_queue_full(max_queued_per_user))
            if row["queue_full"] and delay > 0:
                raise QueueFull(messages.delayed_full(max_delayed))
            if row["queue_full"]:
                raise QueueFull(messages.queue_full(max_queue_depth))
            # Lost an idempotency race to a transaction that committed meanwhile: go again.
        raise StoreUnavailable(
            f"submit of idempotency key {new.idempotency_key!r} kept racing; try again"
        )

    async def _existing(self, new: NewRun, run_id: str, component: str) -> SubmitResult:
        if component != f"{new.component_type}/{new.component_id}":
            raise IdempotencyConflict(
                messages.idempotency_conflict(new.idempotency_key or "", component)
            )
        run = await self.get(run_id)
        if run is None:  # purged between the two statements; extremely unlikely
            raise StoreUnavailable(f"run {run_id} vanished while answering its idempotency key")
        return SubmitResult(run, False)

    async def submit_many(self, news: Sequence[NewRun]) -> list[str]:
        ids = [n.id or new_run_id() for n in news]
        if not ids:
            return ids
        # Every payload encoded and sealed before any SQL, so a bad value writes nothing.
        values = [
            rows.insert_values(n, run_id, self._sealer, rows.encoded_payload(n))
            for run_id, n in zip(ids, news, strict=True)
        ]
        try:
            async with self._db.transaction() as con:
                # One clock for the batch, the transaction's (what the INSERT would use);
                # then binary COPY straight into the run table: no parameter arrays to
                # build and unpack, and the unique index still refuses a taken
                # idempotency key for the whole batch.
                now: float = await con.fetchval(self._sql.now)
                await con.copy_records_to_table(
                    "runs",
                    schema_name=self.schema,
                    columns=pg_sql.SUBMIT_COPY_COLUMNS,
                    records=[
                        _copy_record(v, n.concurrency_key, now)
                        for v, n in zip(values, news, strict=True)
                    ],
                )
        except asyncpg.UniqueViolationError as e:
            raise Conflict(messages.bulk_refused(e)) from e
        return ids

    async def get(self, run_id: str) -> Run | None:
        row = await self._db.fetchrow(self._sql.get, run_id, retry=True)
        return None if row is None else self._run(row)

    async def _refusal(self, run_id: str) -> Run:
        """The run as it is now, for deciding why a conditional UPDATE matched nothing."""
        run = await self.get(run_id)
        if run is None:
            raise NotFound(messages.not_found(run_id))
        return run

    async def cancel(self, run_id: str) -> Run:
        row = await self._db.fetchrow(self._sql.cancel, run_id)
        if row is not None:
            return self._run(row)
        run = await self._refusal(run_id)
        if run.status == Status.CANCELLED:
            return run
        raise Conflict(messages.cancel_refused(run_id, run.status.value))

    async def continue_(self, run_id: str, decision: Any) -> Run:
        sealed = rows.seal_json(self._sealer, "decision", run_id, decision)
        row = await self._db.fetchrow(self._sql.continue_, run_id, sealed)
        if row is not None:
            return self._run(row)
        row = await self._db.fetchrow(self._sql.get, run_id, retry=True)
        if row is None:
            raise NotFound(messages.not_found(run_id))
        if rows.is_repeat_continue(row):
            return self._run(row)
        raise Conflict(messages.continue_refused(run_id, row["status"]))

    async def requeue(
        self, run_id: str, *, clear_cancellation: bool, force: bool, lock_grace_seconds: float
    ) -> Run:
        row = await self._db.fetchrow(
            self._sql.requeue, run_id, clear_cancellation, force, float(lock_grace_seconds)
        )
        if row is not None:
            return self._run(row)
        run = await self._refusal(run_id)
        if run.status not in TRANSITIONS["requeue"].sources:
            raise InvalidTransition(messages.requeue_refused(run_id, run.status.value))
        raise Conflict(messages.requeue_too_soon(run_id, lock_grace_seconds))

    # -- worker -------------------------------------------------------------------------

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
        sql = self._sql
        claims = await self._claim_pool()
        rules = [serialize_sessions, *_blocked_params(blocked)]
        if self.flow.enabled:
            found = await self._claim_limited(worker_id, slots, rules, deployment_id, run_id)
        elif run_id is not None:
            found = await claims.fetch(
                sql.claim_one, worker_id, run_id, *rules, deployment_id or ""
            )
        elif deployment_id:
            found = await claims.fetch(sql.claim_affinity, worker_id, slots, *rules, deployment_id)
        else:
            found = await claims.fetch(sql.claim, worker_id, slots, *rules)
        runs, broken = rows.open_claimed(rows.in_claim_order(found), self._sealer)
        if broken:
            # Given back, not left running: a replica holding the wrong keys must neither
            # strand the batch nor spend attempts until the reaper dead-letters the runs.
            await self._db.fetch(
                sql.release,
                worker_id,
                [row["id"] for row, _ in broken],
                [row["attempt"] for row, _ in broken],
                [messages.not_executed(error) for _, error in broken],
            )
        return ClaimedRuns(runs, unopenable=(row["id"] for row, _ in broken))

    async def _claim_limited(
        self,
        worker_id: str,
        slots: int,
        rules: list[Any],
        deployment_id: str | None,
        run_id: str | None,
    ) -> list[Any]:
        """The claim under ``[limits]``: in one transaction, take the limits lock, count what
        runs and what each rate window has spent, claim within the room left, and count the
        starts into the rate windows. The lock makes the count and the claim one step for
        the fleet: a second claimer counts after this one commits."""
        sql, flow = self._sql, self.flow
        async with self._db.transaction() as con:
            await con.execute(sql.limits_lock, f"{self.schema}.runq.limits")
            now, rows_running = _running(await con.fetch(sql.running_by_component))
            running = flow.running_by_group((c, n) for c, _, n in rows_running)
            keyed = flow.key_running(rows_running)
            used = [0] * len(flow.groups)
            if flow.has_rates:
                stored = await con.fetch(sql.rate_windows_get, flow.patterns)
                used = flow.rate_used(
                    now, {r["pattern"]: (r["window_start"], r["used"]) for r in stored}
                )
            gate = [
                flow.like_patterns,
                flow.room(running, used),
                flow.per_key_max(),
                [i + 1 for i, _, _ in keyed],  # SQL arrays count from 1
                [key for _, key, _ in keyed],
                [n for _, _, n in keyed],
            ]
            dep = deployment_id or ""
            if run_id is not None:
                found = await con.fetch(
                    sql.claim_limited_one, worker_id, run_id, *rules, dep, *gate
                )
            elif deployment_id:
                found = await con.fetch(
                    sql.claim_limited_affinity, worker_id, slots, *rules, dep, *gate
                )
            else:
                found = await con.fetch(sql.claim_limited, worker_id, slots, *rules, dep, *gate)
            if flow.has_rates and found:
                bumps = flow.started(
                    now, (f"{r['component_type']}/{r['component_id']}" for r in found)
                )
                if bumps:
                    await con.execute(
                        sql.rate_windows_bump,
                        list(bumps),
                        [start for start, _ in bumps.values()],
                        [n for _, n in bumps.values()],
                    )
        return list(found)

    # -- pauses ------------------------------------------------------------------------

    async def add_pause(
        self, kind: str, target: str, *, reason: str | None, created_by: str | None
    ) -> tuple[Pause, bool]:
        like = like_pattern(target) if kind == "component" else None
        row = await self._db.fetchrow(
            self._sql.pause_insert, new_run_id(), kind, target, like, reason, created_by
        )
        return rows.pause_from_row(row), bool(row["created"])

    async def remove_pause(self, key: str, *, kind: str = "", target: str = "") -> Pause | None:
        found = await self._db.fetch(self._sql.pause_delete, key, kind, target)
        return rows.pause_from_row(found[0]) if found else None

    async def list_pauses(self) -> list[Pause]:
        return [
            rows.pause_from_row(r) for r in await self._db.fetch(self._sql.pause_list, retry=True)
        ]

    async def flow_state(self) -> FlowState:
        sql = self._sql
        async with self._db.transaction() as con:
            now, found = _running(await con.fetch(sql.running_by_component))
            stored = await con.fetch(sql.rate_windows_get, self.flow.patterns)
        running, keys = split_running(found)
        windows = {r["pattern"]: (r["window_start"], r["used"]) for r in stored}
        return FlowState(now=now, running=running, windows=windows, keys=keys)

    async def session_ahead(self, run_id: str, session_id: str) -> bool:
        return bool(await self._db.fetchval(self._sql.session_ahead, run_id, session_id))

    async def queued_by_component(self) -> list[tuple[str, str, int, int]]:
        found = await self._db.fetch(self._sql.queued_by_component, retry=True)
        return [(r["component"], r["deployment_id"], r["ready"], r["delayed"]) for r in found]

    async def heartbeat_many(self, worker_id: str, leases: Sequence[Lease]) -> HeartbeatResult:
        # Sorted by id, so concurrent batches of one worker lock rows in the same order.
        ordered = sorted(leases, key=lambda le: le.run_id)
        renewed = await self._db.fetch(
            self._sql.heartbeat,
            worker_id,
            [le.run_id for le in ordered],
            [le.attempt for le in ordered],
        )
        return rows.heartbeat_result(
            leases,
            {(r["id"], r["attempt"]) for r in renewed},
            (r["id"] for r in renewed if r["cancel_requested"]),
        )

    async def complete_many(self, worker_id: str, completions: Sequence[Completion]) -> FenceResult:
        if not completions:
            return FenceResult()
        ordered = sorted(completions, key=lambda c: c.run_id)
        done = await self._db.fetch(
            self._sql.complete,
            worker_id,
            [c.run_id for c in ordered],
            [c.attempt for c in ordered],
            [rows.seal_answer(self._sealer, c) for c in ordered],
            [c.termination_reason.value for c in ordered],
        )
        return rows.fence_result(completions, {r["id"] for r in done})

    async def fail(
        self,
        worker_id: str,
        lease: Lease,
        *,
        error: str,
        retryable: bool,
        retry_in_seconds: float,
    ) -> FailOutcome:
        status = await self._db.fetchval(
            self._sql.fail,
            lease.run_id,
            lease.attempt,
            worker_id,
            retryable,
            max(float(retry_in_seconds), 0.0),
            error,
        )
        return rows.fail_outcome(status)

    async def pause(self, worker_id: str, lease: Lease, *, reason: str, state: Any) -> bool:
        sealed = rows.seal_json(self._sealer, "resume_state", lease.run_id, state)
        found = await self._db.fetchval(
            self._sql.pause, lease.run_id, lease.attempt, worker_id, reason, sealed
        )
        return found is not None

    async def settle_cancelled(self, worker_id: str, lease: Lease) -> bool:
        found = await self._db.fetchval(
            self._sql.settle_cancelled, lease.run_id, lease.attempt, worker_id
        )
        return found is not None

    async def set_non_idempotent(self, worker_id: str, lease: Lease, inside: bool) -> bool:
        found = await self._db.fetchval(
            self._sql.set_non_idempotent, lease.run_id, lease.attempt, worker_id, inside
        )
        return found is not None

    async def record_usage(
        self, worker_id: str, lease: Lease, *, tokens: int, cost: float, keys: Sequence[UsageKey]
    ) -> None:
        await self._db.fetch(
            self._sql.record_usage, *_key_arrays(keys), int(tokens), float(cost), lease.run_id
        )

    async def count_claimed_run(self, keys: Sequence[UsageKey]) -> None:
        if keys:
            await self._db.fetch(self._sql.count_claimed_run, *_key_arrays(keys))

    async def usage_totals(self, keys: Sequence[UsageKey]) -> dict[UsageKey, UsageTotals]:
        totals = {k: UsageTotals() for k in keys}
        if not keys:
            return totals
        found = await self._db.fetch(self._sql.usage_totals, *_key_arrays(keys), retry=True)
        for r in found:
            key = UsageKey(r["scope"], r["subject"], r["period_start"])
            totals[key] = UsageTotals(cost=r["cost"], tokens=r["tokens"], runs=r["runs"])
        return totals

    async def usage_in_periods(
        self, periods: Sequence[tuple[str, float]]
    ) -> dict[UsageKey, UsageTotals]:
        if not periods:
            return {}
        found = await self._db.fetch(
            self._sql.usage_in_periods,
            [scope for scope, _ in periods],
            [float(start) for _, start in periods],
            retry=True,
        )
        return {
            UsageKey(r["scope"], r["subject"], r["period_start"]): UsageTotals(
                cost=r["cost"], tokens=r["tokens"], runs=r["runs"]
            )
            for r in found
        }

    # -- maintenance --------------------------------------------------------------------

    async def reap_stale(self, *, lock_grace_seconds: float, limit: int) -> ReapReport:
        if limit <= 0:
            return ReapReport()
        row = await self._db.fetchrow(
            self._sql.reap,
            float(lock_grace_seconds),
            limit,
            messages.REAP_NON_IDEMPOTENT_ERROR,
            messages.REAP_NO_REQUEST_ERROR,
        )
        requeued, dead = list(row["requeued"]), list(row["dead"])
        return ReapReport(
            requeued=len(requeued),
            dead_lettered=len(dead),
            skipped=row["seen"] - len(requeued) - len(dead),
            requeued_ids=requeued,
            dead_lettered_ids=dead,
        )

    async def purge_batch(
        self, *, retention_seconds: float, paused_retention_seconds: float, limit: int
    ) -> int:
        limit = max(int(limit), 1)
        if paused_retention_seconds > 0:  # 0 = paused runs wait until decided
            deleted: int = await self._db.fetchval(
                self._sql.purge_with_paused,
                float(retention_seconds),
                limit,
                float(paused_retention_seconds),
            )
        else:
            deleted = await self._db.fetchval(self._sql.purge, float(retention_seconds), limit)
        return deleted

    async def register_worker(self, info: WorkerInfo) -> None:
        await self._db.fetch(
            self._sql.register_worker, info.id, info.hostname, info.pid, info.deployment_id or ""
        )

    async def remove_worker(self, worker_id: str) -> None:
        await self._db.fetch(self._sql.remove_worker, worker_id)

    async def prune_workers(self, *, max_age_seconds: float) -> int:
        pruned: int = await self._db.fetchval(self._sql.prune_workers, float(max_age_seconds))
        return pruned

    async def list_workers(self, *, max_age_seconds: float) -> list[WorkerInfo]:
        found = await self._db.fetch(self._sql.list_workers, float(max_age_seconds), retry=True)
        return [rows.row_to_worker(r) for r in found]

    # -- reads for operators ------------------------------------------------------------

    async def stats(self) -> Stats:
        row = await self._db.fetchrow(self._sql.stats, retry=True)
        return Stats(
            counts=_counts(row["statuses"], row["ns"]),
            oldest_queued_age_seconds=row["oldest_age"],
        )

    async def health(
        self, *, lock_grace_seconds: float, worker_max_age_seconds: float
    ) -> QueueHealth:
        row = await self._db.fetchrow(
            self._sql.health, float(lock_grace_seconds), float(worker_max_age_seconds), retry=True
        )
        return QueueHealth(
            counts=_counts(row["statuses"], row["ns"]),
            oldest_queued_age_seconds=row["oldest_age"],
            oldest_queued_age_by_deployment=dict(
                zip(row["deps"] or [], row["ages"] or [], strict=True)
            ),
            expired_leases=row["expired"],
            live_workers=row["live"],
        )

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
        page_sql, count_sql = pg_sql.list_jobs(
            self.schema,
            statuses=statuses,
            by_user=user_id is not None,
            sort_by=sort_by,
            sort_order=sort_order,
            limit=limit,
            offset=(page - 1) * limit,
        )
        args = [] if user_id is None else [user_id]

        async def read(pool: asyncpg.Pool) -> tuple[int, list[Any]]:
            async with pool.acquire() as con:
                total = await con.fetchval(count_sql, *args)
                found = await con.fetch(page_sql, *args)
                return total, found

        total, found = await self._db.call(read, retry=True)
        return Page(data=[self._run(r) for r in found], page=page, limit=limit, total_count=total)

    async def reseal_page(self, *, after_id: str, limit: int) -> tuple[str | None, int]:
        async with self._db.transaction() as con:
            page = await con.fetch(pg_sql.reseal_select(self._sql, limit), after_id)
            if not page:
                return None, 0
            columns: dict[str, list[bytes | None]] = {c: [] for c in SEALED_COLUMNS}
            resealed = 0
            for row in page:
                for column in SEALED_COLUMNS:
                    new = rows.resealed(self._sealer, column, row["id"], row[column])
                    columns[column].append(row[column] if new is None else new)
                    resealed += new is not None
            if resealed:
                await con.execute(
                    self._sql.reseal_update,
                    [r["id"] for r in page],
                    *(columns[c] for c in SEALED_COLUMNS),
                )
            last: str = page[-1]["id"]
            return last, resealed

    async def count_runs(self) -> int:
        total: int = await self._db.fetchval(self._sql.count_runs, retry=True)
        return total

    async def run_ids_with_prefix(self, prefix: str, *, limit: int) -> list[str]:
        found = await self._db.fetch(self._sql.ids_with_prefix, prefix, max(limit, 1), retry=True)
        return [row["id"] for row in found]

    # -- schedules and unique runs ----------------------------------------------------------

    @property
    def _schedule_sql(self) -> pg_sql.ScheduleStatements:
        offset = self.clock_offset_seconds
        if self._schedule_cache is None or self._schedule_cache[0] != offset:
            self._schedule_cache = (offset, pg_sql.build_schedules(self.schema, offset))
        return self._schedule_cache[1]

    _schedule_cache: tuple[float, pg_sql.ScheduleStatements] | None = None

    async def _submit_unique(
        self, new: NewRun, args: Sequence[Any], max_queue_depth: int
    ) -> SubmitResult:
        """Submit under the unique key's lock row: the first of concurrent submitters of a
        key inserts, the others wait for its commit and then find its run."""
        assert new.unique is not None
        component = f"{new.component_type}/{new.component_id}"
        sql = self._schedule_sql
        async with self._db.transaction() as con:
            lock = await con.fetchrow(sql.unique_lock, component, new.unique.key)
            if lock["run_id"] is not None:
                row = await con.fetchrow(self._sql.get, lock["run_id"])
                if row is not None and new.unique.holds(
                    Status(row["status"]), row["created_at"], lock["db_now"]
                ):
                    return SubmitResult(self._run(row), False)
            result = await self._submit_row(new, args, max_queue_depth, con)
            if result.created:
                await con.execute(sql.unique_set, component, new.unique.key, result.run.id)
            return result

    async def schedule_states(self, names: Sequence[str]) -> tuple[float, list[ScheduleState]]:
        if not names:
            return await self.now(), []
        found = await self._db.fetch(self._schedule_sql.schedule_states, list(names))
        now = found[0]["db_now"] if found else await self.now()
        return now, [rows.schedule_state(r) for r in found]

    async def fire_schedule_slot(
        self, name: str, slot_at: float, new: NewRun, *, skip_if_running: bool
    ) -> SlotFire:
        run_id = new.id or new_run_id()
        values = rows.insert_values(new, run_id, self._sealer, rows.encoded_payload(new))
        row = await self._db.fetchrow(
            self._schedule_sql.fire_slot, name, slot_at, skip_if_running, *values
        )
        return SlotFire(recorded=row["recorded"] > 0, run_id=row["run_id"])

    async def advance_schedule_cursor(self, name: str, cursor_at: float) -> None:
        await self._db.fetchval(self._schedule_sql.advance_cursor, name, cursor_at)

    async def set_schedule_paused(self, name: str, paused: bool) -> ScheduleState:
        row = await self._db.fetchrow(self._schedule_sql.set_paused, name, paused)
        return rows.schedule_state(row)

    async def recent_schedule_slots(
        self, name: str, *, limit: int
    ) -> list[tuple[float, str | None]]:
        found = await self._db.fetch(self._schedule_sql.recent_slots, name, limit, retry=True)
        return [(r["slot_at"], r["run_id"]) for r in found]

    async def prune_schedule_slots(self, name: str, *, before: float) -> int:
        deleted: int = await self._db.fetchval(self._schedule_sql.prune_slots, name, before)
        return deleted

    # -- the event log ------------------------------------------------------------------

    async def append_events(self, worker_id: str, lease: Lease, events: Sequence[NewEvent]) -> bool:
        return lease.run_id in await self.append_events_many(worker_id, [(lease, events)])

    async def append_events_many(
        self, worker_id: str, batches: Sequence[tuple[Lease, Sequence[NewEvent]]]
    ) -> set[str]:
        batches = [(lease, events) for lease, events in batches if events]
        if not batches:
            return set()
        sql = self._sql
        async with self._db.transaction() as con:
            reserved = await con.fetch(
                sql.events_reserve_many,
                worker_id,
                [lease.run_id for lease, _ in batches],
                [lease.attempt for lease, _ in batches],
                [len(events) for _, events in batches],
            )
            last = {row["id"]: row["event_seq"] for row in reserved}
            ids: list[str] = []
            attempts: list[int] = []
            seqs: list[int] = []
            kinds: list[str] = []
            data: list[bytes | None] = []
            for lease, events in batches:
                if lease.run_id not in last:
                    continue
                first = last[lease.run_id] - len(events) + 1
                for seq, kind, sealed in event_rows.sealed_batch(
                    self._sealer, lease.run_id, first, events
                ):
                    ids.append(lease.run_id)
                    attempts.append(lease.attempt)
                    seqs.append(seq)
                    kinds.append(kind)
                    data.append(sealed)
            if ids:
                await con.fetchval(
                    sql.events_insert_many, ids, attempts, seqs, kinds, data, self.channel
                )
            return set(last)

    async def list_events(self, run_id: str, *, after: int, limit: int) -> list[RunEvent]:
        found = await self._db.fetch(self._sql.events_list, run_id, after, limit, retry=True)
        return [event_rows.to_event(self._sealer, run_id, *row) for row in found]

    async def trim_events(self, run_id: str, level: str, redacted_max_chars: int) -> None:
        if level == "full":
            return
        if level == "redacted":
            stored = [tuple(r) for r in await self._db.fetch(self._sql.events_sealed, run_id)]
            resealed = await anyio.to_thread.run_sync(
                event_rows.redacted, self._sealer, run_id, stored, redacted_max_chars
            )
            if resealed:
                await self._db.fetch(
                    self._sql.events_reseal,
                    run_id,
                    [seq for seq, _ in resealed],
                    [data for _, data in resealed],
                )
            return
        await self._db.fetch(self._sql.events_trim, run_id, level == "none")


def _copy_record(v: rows.InsertValues, concurrency_key: str | None, now: float) -> tuple[Any, ...]:
    """One row for ``SUBMIT_COPY_COLUMNS``: queued, attempt 0, created and updated now."""
    return (
        v.id,
        v.component_type,
        v.component_id,
        "queued",
        0,
        v.max_attempts,
        v.priority,
        v.session_id,
        v.user_id,
        v.actor,
        v.configuration,
        v.deployment_id,
        v.idempotency_key,
        v.origin,
        now,
        now,
        now + v.delay,
        v.has_request,
        v.payload,
        concurrency_key,
    )
