"""PostgreSQL engine: an asyncpg pool, ``FOR UPDATE SKIP LOCKED`` claims, batched writes.

Every verb is one statement (a few CTEs at most) so each costs one round trip and its
affected rows decide races. Statement texts are built once per (schema, clock offset)
and never carry user input, so asyncpg's per-connection statement cache keeps them
prepared. Every time written comes from the database clock (``now()`` of the statement's
transaction, plus ``clock_offset_seconds``, which only tests set).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import asyncpg.exceptions as pgerr

from runq.config import redact_url
from runq.errors import (
    ConfigError,
    Conflict,
    IdempotencyConflict,
    InvalidTransition,
    NotFound,
    QueueFull,
    StoreUnavailable,
)
from runq.model import (
    FINAL_STATUSES,
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

__all__ = ["PostgresStore"]

T = TypeVar("T")

#: Errors that mean "the database is not reachable right now", never "your request is wrong".
#: OperatorIntervention covers admin shutdown, crash recovery and "cannot connect now";
#: InsufficientResources covers too many connections, out of memory and a full disk.
#: The statement may or may not have reached the server.
_MAYBE_SENT: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    pgerr.PostgresConnectionError,
    pgerr.OperatorInterventionError,
    pgerr.InsufficientResourcesError,
    pgerr.ReadOnlySQLTransactionError,  # a failed-over primary that is now a standby
)
#: The client refused to start the operation on a broken or closed connection, so nothing
#: was sent. A pooled connection whose backend died while idle ends up here on its next
#: use ("cannot switch to state ...; another operation is in progress").
_NOT_SENT: tuple[type[BaseException], ...] = (asyncpg.InterfaceError, pgerr.InternalClientError)
#: ...except these subclasses, which are mistakes in the request, not an outage.
_NOT_AN_OUTAGE: tuple[type[BaseException], ...] = (
    pgerr.DataError,
    pgerr.ClientConfigurationError,
    pgerr.UnsupportedClientFeatureError,
    pgerr.UnsupportedServerFeatureError,
    pgerr.OutdatedSchemaCacheError,
)
_UNAVAILABLE: tuple[type[BaseException], ...] = (*_MAYBE_SENT, *_NOT_SENT)
#: Errors of connect(): the above plus a refused login or an unknown database.
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (*_UNAVAILABLE, asyncpg.PostgresError)


def _outage(error: BaseException) -> bool:
    return isinstance(error, _UNAVAILABLE) and not isinstance(error, _NOT_AN_OUTAGE)


#: The schema name is interpolated into every statement, so it must be a plain identifier.
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_FINAL = sql_status_list(FINAL_STATUSES)
_ACTIVE = "'paused', 'queued', 'running'"  # must imply runs_session_active_idx's predicate
_RUNNING = "'running'"


def _still_running(alias: str = "") -> str:
    """The ``status = 'running'`` part of a fence, written so no index can serve it.

    A fenced write names its row by primary key. Left as a plain comparison, the planner
    may prefer runs_status_created_idx whenever statistics say few runs are running (right
    after a bulk load, say) and then walk every running entry, dead versions included,
    for each write. ``IS TRUE`` is the same test on a NOT NULL column but is no index
    qual, so the primary key is always the path.
    """
    p = f"{alias}." if alias else ""
    return f"({p}status = 'running') IS TRUE"


#: How many rows one submit_many statement carries; larger batches just take more statements.
_BULK_CHUNK = 5000
#: How often submit re-runs after losing an idempotency race (the winner is then visible).
_SUBMIT_ATTEMPTS = 3


def _clock(offset: float) -> str:
    # A float literal keeps the text stable for a given offset (the offset is 0 outside
    # tests), so the statement stays prepared; repr() round-trips the exact value.
    return f"(extract(epoch from now())::float8 + ({float(offset)!r})::float8)"


@dataclass(frozen=True, slots=True)
class _Sql:
    """Every statement text of one (schema, clock offset), built once."""

    now: str
    get: str
    count_runs: str
    submit: str
    submit_many: str
    cancel: str
    continue_: str
    requeue: str
    claim: str
    claim_affinity: str
    claim_one: str
    heartbeat: str
    complete: str
    fail: str
    pause: str
    settle_cancelled: str
    set_non_idempotent: str
    record_usage: str
    count_claimed_run: str
    usage_totals: str
    usage_in_periods: str
    reap: str
    purge_final: str
    purge_paused: str
    register_worker: str
    remove_worker: str
    prune_workers: str
    list_workers: str
    stats: str
    health: str
    reseal_select: str
    reseal_update: str
    notify: str


def _claim_filters(s: str, now: str, first: int) -> str:
    """The per-row claim rules shared by every claim variant.

    Parameters from ``$first``: serialize (bool), blocked users, blocked configurations,
    blocked pair users, blocked pair configurations (text[] each; empty = nothing blocked).
    The session rule probes runs_session_active_idx: a run waits while an older run of its
    session is not final, or any run of its session is running or paused.
    """
    ser, users, confs, pu, pc = (f"${first + i}" for i in range(5))
    return f"""
        r.available_at <= {now}
        AND (NOT {ser}::bool OR r.session_id IS NULL OR NOT EXISTS (
            SELECT 1 FROM {s}.runs o
            WHERE o.session_id = r.session_id AND o.status IN ({_ACTIVE})
              AND (o.id < r.id OR o.status <> 'queued')))
        AND coalesce(r.user_id, '') <> ALL({users}::text[])
        AND coalesce(r.configuration, '') <> ALL({confs}::text[])
        AND NOT EXISTS (
            SELECT 1 FROM unnest({pu}::text[], {pc}::text[]) AS b(u, c)
            WHERE b.u = coalesce(r.user_id, '') AND b.c = coalesce(r.configuration, ''))"""


def _claim_update(s: str, now: str, candidates: str) -> str:
    """Take the lease on the locked candidate ids (CTE ``c``); ``$1`` is the worker id.

    ``id = ANY(ARRAY(...))`` rather than a join: a prepared statement may run a generic
    plan, which cannot see ``LIMIT $2`` and guesses thousands of candidates; a join would
    then hash the whole table, while ``= ANY`` always probes the primary key.
    """
    return f"""
        WITH c AS MATERIALIZED ({candidates})
        UPDATE {s}.runs AS u
        SET status = 'running', attempt = u.attempt + 1, locked_by = $1,
            locked_at = {now}, started_at = {now}, updated_at = {now}
        WHERE u.id = ANY(ARRAY(SELECT id FROM c))
        RETURNING u.*"""


def _claim_sql(s: str, now: str) -> tuple[str, str, str]:
    """(no deployment, with a deployment, one run by id).

    Each branch walks runs_claim_idx for ONE deployment_id in claim order, so final rows
    (outside the partial index) and other deployments' rows are never read, and stops after
    ``slots`` rows it could lock. A worker with a deployment runs two such walks (no
    deployment, and its own) and keeps the first ``slots`` of at most 2 x ``slots``
    candidates; the extra rows stay locked only until this statement commits. An
    ``IN ('', $dep)`` walk would instead read every claimable row of both deployments
    and sort them (PostgreSQL 15 cannot keep index order across an IN list).
    """
    filters = _claim_filters(s, now, 3)

    def branch(columns: str, dep: str) -> str:
        return (
            f"SELECT {columns} FROM {s}.runs r "
            f"WHERE r.status = 'queued' AND r.deployment_id = {dep} AND {filters} "
            "ORDER BY r.priority, r.available_at, r.id LIMIT $2 FOR UPDATE SKIP LOCKED"
        )

    ordered = "r.id, r.priority, r.available_at"
    plain = branch("r.id", "''")
    merged = f"""
        SELECT m.id FROM (
            SELECT * FROM ({branch(ordered, "''")}) AS a
            UNION ALL
            SELECT * FROM ({branch(ordered, "$8")}) AS b
        ) AS m
        ORDER BY m.priority, m.available_at, m.id LIMIT $2"""
    one = f"""
        SELECT r.id FROM {s}.runs r
        WHERE r.id = $2 AND r.status = 'queued' AND r.deployment_id IN ('', $8) AND {filters}
        FOR UPDATE SKIP LOCKED"""
    return (
        _claim_update(s, now, plain),
        _claim_update(s, now, merged),
        _claim_update(s, now, one),
    )


def _reap_sql(s: str, now: str) -> str:
    """DESIGN §6 as one statement.

    ``cand`` scans stale leases oldest first; ``locked`` locks them with SKIP LOCKED and
    re-checks staleness on the newest row version (a lease renewed meanwhile, or a run
    another reaper settled, drops out and counts as skipped); the UPDATE applies the rules
    in order with CASE. $1 grace seconds, $2 limit, $3/$4 the texts of rules 1 and 2.
    Rows are addressed with ``id = ANY(ARRAY(...))`` so even a generic plan probes the
    primary key (see ``_claim_update``); the rule-3 text is an SQL expression over the
    row's own id, attempt and max_attempts.
    """
    stale = f"status = 'running' AND locked_at < {now} - $1::float8"
    dead = "(u.non_idempotent OR NOT u.has_request OR u.attempt >= u.max_attempts)"
    return f"""
        WITH cand AS MATERIALIZED (
            SELECT id, attempt FROM {s}.runs WHERE {stale}
            ORDER BY locked_at, id LIMIT $2
        ),
        locked AS MATERIALIZED (
            SELECT r.id FROM {s}.runs r
            WHERE r.id = ANY(ARRAY(SELECT id FROM cand))
              AND {_still_running("r")} AND r.locked_at < {now} - $1::float8
              AND r.attempt = (SELECT c.attempt FROM cand c WHERE c.id = r.id)
            FOR UPDATE OF r SKIP LOCKED
        ),
        upd AS (
            UPDATE {s}.runs AS u SET
                status = CASE WHEN {dead} THEN 'failed' ELSE 'queued' END,
                termination_reason = CASE
                    WHEN u.non_idempotent OR NOT u.has_request THEN 'not_retryable'
                    WHEN u.attempt >= u.max_attempts THEN 'retries_exhausted'
                    ELSE NULL END,
                error = CASE
                    WHEN u.non_idempotent THEN $3::text
                    WHEN NOT u.has_request THEN $4::text
                    WHEN u.attempt >= u.max_attempts THEN {common.reap_exhausted_error_sql()}
                    ELSE u.error END,
                completed_at = CASE WHEN {dead} THEN {now} ELSE NULL END,
                available_at = CASE WHEN {dead} THEN u.available_at ELSE {now} END,
                resume_state = CASE WHEN {dead} THEN NULL ELSE u.resume_state END,
                decision = CASE WHEN {dead} THEN NULL ELSE u.decision END,
                locked_by = NULL, locked_at = NULL, updated_at = {now}
            WHERE u.id = ANY(ARRAY(SELECT id FROM locked))
            RETURNING u.id, u.status
        )
        SELECT (SELECT count(*) FROM cand) AS seen,
               ARRAY(SELECT id FROM upd WHERE status = 'queued' ORDER BY id) AS requeued,
               ARRAY(SELECT id FROM upd WHERE status = 'failed' ORDER BY id) AS dead"""


_INSERT_COLUMNS = (
    "id, component_type, component_id, status, attempt, max_attempts, priority, session_id, "
    "user_id, actor, configuration, deployment_id, idempotency_key, origin, created_at, "
    "updated_at, available_at, has_request, payload"
)


def _submit_sql(s: str, now: str) -> str:
    """Idempotency lookup, depth gate and insert in one round trip.

    $1 id, $2 type, $3 component id, $4 max_attempts, $5 priority, $6 session, $7 user,
    $8 actor, $9 configuration, $10 deployment, $11 idempotency key, $12 origin,
    $13 delay, $14 has_request, $15 payload, $16 max_queue_depth (0 = unbounded),
    $17 the NOTIFY channel when the insert should wake the listeners (NULL: no NOTIFY).
    The depth count stops at the limit (a bounded index-only walk of the queued rows).
    ON CONFLICT covers a concurrent submit of the same key: nothing is returned then and
    the caller re-runs the statement, which now sees the winner in ``existing``.
    """
    return f"""
        WITH existing AS (
            SELECT id, component_type, component_id FROM {s}.runs
            WHERE idempotency_key = $11 AND coalesce(user_id, '') = coalesce($7, '')
        ),
        gate AS (
            SELECT $16::bigint > 0 AND (
                SELECT count(*) FROM (
                    SELECT 1 FROM {s}.runs WHERE status = 'queued' LIMIT $16::bigint
                ) AS q
            ) >= $16::bigint AS is_full
        ),
        ins AS (
            INSERT INTO {s}.runs ({_INSERT_COLUMNS})
            SELECT $1, $2, $3, 'queued', 0, $4, $5, $6, $7, $8, $9, $10, $11, $12,
                   {now}, {now}, {now} + $13::float8, $14, $15
            WHERE NOT EXISTS (SELECT 1 FROM existing) AND NOT (SELECT is_full FROM gate)
            ON CONFLICT (idempotency_key, (coalesce(user_id, '')))
                WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING *
        )
        SELECT ins.*,
               (SELECT id FROM existing) AS existing_id,
               (SELECT component_type || '/' || component_id FROM existing)
                   AS existing_component,
               (SELECT is_full FROM gate) AS queue_full,
               CASE WHEN $17::text IS NOT NULL AND ins.id IS NOT NULL
                    THEN pg_notify($17::text, 'wake') IS NULL END AS notified
        FROM (SELECT 1) AS one LEFT JOIN ins ON true"""


def _submit_many_sql(s: str, now: str) -> str:
    return f"""
        INSERT INTO {s}.runs ({_INSERT_COLUMNS})
        SELECT v.id, v.ct, v.ci, 'queued', 0, v.ma, v.pr, v.sid, v.uid, v.actor, v.conf,
               v.dep, v.key, v.origin, {now}, {now}, {now} + v.delay, v.hr, v.payload
        FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::int[], $6::text[],
                    $7::text[], $8::text[], $9::text[], $10::text[], $11::text[],
                    $12::text[], $13::float8[], $14::bool[], $15::bytea[])
            AS v(id, ct, ci, ma, pr, sid, uid, actor, conf, dep, key, origin, delay, hr, payload)"""


def _fenced(alias: str = "") -> str:
    """The fence of DESIGN §2.4 for single-lease verbs: $1 id, $2 attempt, $3 worker."""
    p = f"{alias}." if alias else ""
    return f"{p}id = $1 AND {p}attempt = $2 AND {p}locked_by = $3 AND {_still_running(alias)}"


def _lifecycle_sql(s: str, now: str) -> dict[str, str]:
    """Operator and producer transitions (cancel, continue, requeue)."""
    cancel_src = sql_status_list(TRANSITIONS["cancel"].sources)
    requeue_src = sql_status_list(TRANSITIONS["requeue"].sources)
    return {
        # queued/paused: cancelled at once; running: intent only. The cancel is recorded in
        # both cases, so an operator requeue keeps it unless told to clear it.
        "cancel": f"""
            UPDATE {s}.runs SET
                cancel_requested = true, updated_at = {now},
                status = CASE WHEN status IN ({cancel_src}) THEN 'cancelled' ELSE status END,
                termination_reason = CASE WHEN status IN ({cancel_src})
                    THEN 'cancelled' ELSE termination_reason END,
                completed_at = CASE WHEN status IN ({cancel_src})
                    THEN {now} ELSE completed_at END,
                resume_state = CASE WHEN status IN ({cancel_src})
                    THEN NULL ELSE resume_state END,
                decision = CASE WHEN status IN ({cancel_src}) THEN NULL ELSE decision END
            WHERE id = $1 AND status IN ({cancel_src}, {_RUNNING})
            RETURNING *""",
        "continue_": f"""
            UPDATE {s}.runs SET
                status = 'queued', decision = $2, max_attempts = attempt + 1,
                available_at = {now}, continued_at = {now}, updated_at = {now}
            WHERE id = $1 AND (status = 'paused') IS TRUE  -- by primary key, see _still_running
            RETURNING *""",
        "requeue": f"""
            UPDATE {s}.runs SET
                status = 'queued', max_attempts = attempt + 1, available_at = {now},
                updated_at = {now}, error = NULL, termination_reason = NULL,
                completed_at = NULL, locked_by = NULL, locked_at = NULL,
                non_idempotent = false,
                cancel_requested = CASE WHEN $2::bool THEN false ELSE cancel_requested END
            WHERE id = $1 AND status IN ({requeue_src})
              AND ($3::bool OR status <> 'failed' OR completed_at IS NULL
                   OR completed_at <= {now} - $4::float8)
            RETURNING *""",
    }


def _worker_sql(s: str, now: str) -> dict[str, str]:
    """Lease-holder verbs: heartbeat, completion, failure, pause, cancel settlement."""
    retry = "($4::bool AND attempt < max_attempts AND NOT non_idempotent)"
    return {
        # The workers row is refreshed in the same round trip (a data-modifying CTE always
        # runs, referenced or not).
        "heartbeat": f"""
            WITH w AS (UPDATE {s}.workers SET last_seen_at = {now} WHERE id = $1)
            UPDATE {s}.runs AS r SET locked_at = {now}
            FROM unnest($2::text[], $3::int[]) AS v(id, attempt)
            WHERE r.id = v.id AND r.attempt = v.attempt AND r.locked_by = $1
              AND {_still_running("r")}
            RETURNING r.id, r.attempt, r.cancel_requested""",
        "complete": f"""
            UPDATE {s}.runs AS r SET
                status = 'completed', answer = v.answer, termination_reason = v.reason,
                completed_at = {now}, updated_at = {now}, locked_by = NULL, locked_at = NULL,
                resume_state = NULL, decision = NULL, non_idempotent = false
            FROM unnest($2::text[], $3::int[], $4::bytea[], $5::text[])
                AS v(id, attempt, answer, reason)
            WHERE r.id = v.id AND r.attempt = v.attempt AND r.locked_by = $1
              AND {_still_running("r")}
            RETURNING r.id""",
        # $4 retryable, $5 retry delay, $6 error. SET sees the old row, so every CASE
        # judges the run as it was before this failure.
        "fail": f"""
            UPDATE {s}.runs SET
                status = CASE WHEN {retry} THEN 'queued' ELSE 'failed' END,
                termination_reason = CASE WHEN {retry} THEN NULL
                    WHEN NOT $4::bool THEN 'not_retryable'
                    WHEN attempt >= max_attempts THEN 'retries_exhausted'
                    ELSE 'not_retryable' END,
                available_at = CASE WHEN {retry}
                    THEN {now} + $5::float8 ELSE available_at END,
                completed_at = CASE WHEN {retry} THEN NULL ELSE {now} END,
                resume_state = CASE WHEN {retry} THEN resume_state ELSE NULL END,
                decision = CASE WHEN {retry} THEN decision ELSE NULL END,
                error = $6, locked_by = NULL, locked_at = NULL, updated_at = {now}
            WHERE {_fenced()}
            RETURNING status""",
        "pause": f"""
            UPDATE {s}.runs SET
                status = 'paused', pause_reason = $4, resume_state = $5, decision = NULL,
                continued_at = NULL, locked_by = NULL, locked_at = NULL, updated_at = {now}
            WHERE {_fenced()}
            RETURNING id""",
        "settle_cancelled": f"""
            UPDATE {s}.runs SET
                status = 'cancelled', termination_reason = 'cancelled', completed_at = {now},
                resume_state = NULL, decision = NULL, locked_by = NULL, locked_at = NULL,
                updated_at = {now}
            WHERE {_fenced()}
            RETURNING id""",
        "set_non_idempotent": f"""
            UPDATE {s}.runs SET non_idempotent = $4
            WHERE {_fenced()}
            RETURNING id""",
    }


def _usage_sql(s: str) -> dict[str, str]:
    upsert = f"""
        INSERT INTO {s}.budget_usage AS b (scope, subject, period_start, cost, tokens, runs)
        SELECT k.scope, k.subject, k.period_start, {{cost}}, {{tokens}}, {{runs}}
        FROM unnest($1::text[], $2::text[], $3::float8[]) AS k(scope, subject, period_start)
        ON CONFLICT (scope, subject, period_start) DO UPDATE SET
            cost = b.cost + excluded.cost, tokens = b.tokens + excluded.tokens,
            runs = b.runs + excluded.runs"""
    return {
        # Unfenced on purpose: the money was spent whether or not the lease still holds.
        "record_usage": f"""
            WITH r AS (
                UPDATE {s}.runs SET tokens = tokens + $4::bigint, cost = cost + $5::float8
                WHERE id = $6
            )
            {upsert.format(cost="$5::float8", tokens="$4::bigint", runs="0")}""",
        "count_claimed_run": upsert.format(cost="0", tokens="0", runs="1"),
        "usage_totals": f"""
            SELECT k.scope, k.subject, k.period_start, b.cost, b.tokens, b.runs
            FROM unnest($1::text[], $2::text[], $3::float8[]) AS k(scope, subject, period_start)
            JOIN {s}.budget_usage b USING (scope, subject, period_start)""",
        "usage_in_periods": f"""
            SELECT b.scope, b.subject, b.period_start, b.cost, b.tokens, b.runs
            FROM {s}.budget_usage b
            WHERE (b.scope, b.period_start) IN (
                SELECT * FROM unnest($1::text[], $2::float8[]))""",
    }


def _maintenance_sql(s: str, now: str) -> dict[str, str]:
    """Retention, worker registry, operator reads, key rotation."""

    def purge(where: str) -> str:
        # Locked in small batches with SKIP LOCKED: a run a worker is touching right now is
        # simply left for the next batch; FOR UPDATE rechecks the predicate on the newest
        # version, so a run requeued meanwhile is not deleted.
        return f"""
            WITH victims AS MATERIALIZED (
                SELECT id FROM {s}.runs WHERE {where} LIMIT $2 FOR UPDATE SKIP LOCKED
            ), d AS (
                DELETE FROM {s}.runs WHERE id = ANY(ARRAY(SELECT id FROM victims)) RETURNING 1
            )
            SELECT count(*) FROM d"""

    oldest = (
        f"SELECT min(available_at) FROM {s}.runs WHERE status = 'queued' AND available_at <= {now}"
    )
    counts = f"SELECT status, count(*) AS n FROM {s}.runs GROUP BY status"
    return {
        "purge_final": purge(f"status IN ({_FINAL}) AND completed_at < {now} - $1::float8"),
        "purge_paused": purge(f"status = 'paused' AND updated_at < {now} - $1::float8"),
        "register_worker": f"""
            INSERT INTO {s}.workers (id, hostname, pid, deployment_id, started_at, last_seen_at)
            VALUES ($1, $2, $3, $4, {now}, {now})
            ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname, pid = excluded.pid,
                deployment_id = excluded.deployment_id, last_seen_at = excluded.last_seen_at""",
        "remove_worker": f"DELETE FROM {s}.workers WHERE id = $1",
        "prune_workers": f"""
            WITH d AS (DELETE FROM {s}.workers WHERE last_seen_at < {now} - $1::float8
                       RETURNING 1)
            SELECT count(*) FROM d""",
        "list_workers": f"""
            SELECT * FROM {s}.workers WHERE last_seen_at >= {now} - $1::float8
            ORDER BY started_at, id""",
        "stats": f"""
            WITH c AS ({counts})
            SELECT (SELECT array_agg(status) FROM c) AS statuses,
                   (SELECT array_agg(n) FROM c) AS ns,
                   {now} - ({oldest}) AS oldest_age""",
        "health": f"""
            WITH c AS ({counts}),
            d AS (
                SELECT deployment_id, {now} - min(available_at) AS age FROM {s}.runs
                WHERE status = 'queued' AND available_at <= {now} GROUP BY deployment_id
            )
            SELECT (SELECT array_agg(status) FROM c) AS statuses,
                   (SELECT array_agg(n) FROM c) AS ns,
                   {now} - ({oldest}) AS oldest_age,
                   (SELECT array_agg(deployment_id) FROM d) AS deps,
                   (SELECT array_agg(age) FROM d) AS ages,
                   (SELECT count(*) FROM {s}.runs
                    WHERE status = 'running' AND locked_at < {now} - $1::float8) AS expired,
                   (SELECT count(*) FROM {s}.workers
                    WHERE last_seen_at >= {now} - $2::float8) AS live""",
        # Rows are locked while re-sealed so a completion cannot slip in between the read
        # and the write and be overwritten with the re-sealed old value. {limit} is filled
        # with an int by reseal_page: a literal LIMIT lets even a generic plan walk the
        # primary key in order instead of sorting the table.
        "reseal_select": f"""
            SELECT id, payload, answer, resume_state, decision FROM {s}.runs
            WHERE id > $1 ORDER BY id LIMIT {{limit}} FOR NO KEY UPDATE""",
        "reseal_update": f"""
            UPDATE {s}.runs AS r SET payload = v.payload, answer = v.answer,
                resume_state = v.resume_state, decision = v.decision
            FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::bytea[], $5::bytea[])
                AS v(id, payload, answer, resume_state, decision)
            WHERE r.id = v.id""",
    }


def _build_sql(schema: str, offset: float) -> _Sql:
    s, now = schema, _clock(offset)
    claim, claim_affinity, claim_one = _claim_sql(s, now)
    return _Sql(
        now=f"SELECT {now}",
        get=f"SELECT * FROM {s}.runs WHERE id = $1",
        count_runs=f"SELECT count(*) FROM {s}.runs",
        submit=_submit_sql(s, now),
        submit_many=_submit_many_sql(s, now),
        claim=claim,
        claim_affinity=claim_affinity,
        claim_one=claim_one,
        reap=_reap_sql(s, now),
        notify="SELECT pg_notify($1, $2)",
        **_lifecycle_sql(s, now),
        **_worker_sql(s, now),
        **_usage_sql(s),
        **_maintenance_sql(s, now),
    )


def _seal_answer(sealer: Sealer, c: Completion) -> bytes | None:
    return common.seal_json(sealer, "answer", c.run_id, c.answer) if c.keep_answer else None


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


def _worker_info(row: Any) -> WorkerInfo:
    return WorkerInfo(
        id=row["id"],
        hostname=row["hostname"],
        pid=row["pid"],
        deployment_id=row["deployment_id"] or None,
        started_at=row["started_at"],
        last_seen_at=row["last_seen_at"],
    )


def _counts(statuses: list[str] | None, ns: list[int] | None) -> dict[str, int]:
    return dict(zip(statuses or [], ns or [], strict=True))


async def _reset_connection(con: asyncpg.Connection) -> None:
    """Pool release hook: nothing to do.

    asyncpg's default reset sends ``RESET ALL; UNLISTEN *; ...`` on every release: a
    second round trip per verb. This pool never changes session state (no LISTEN, no
    session advisory locks, no SET), and the pool itself rolls back an open transaction
    before calling this hook, so skipping the reset is safe and halves the latency of
    every single-statement verb.
    """


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
    ) -> None:
        if not _SCHEMA_RE.match(schema):
            raise ConfigError("store.schema", f"{schema!r} must be a lower-case SQL identifier")
        self.url = url
        self.schema = schema
        self.clock_offset_seconds = 0.0
        self._sealer = sealer
        self._min_size = min_size
        self._max_size = max_size
        self._command_timeout = command_timeout
        self._connect_timeout = connect_timeout
        self._migration_timeout = migration_timeout
        self._application_name = application_name
        self._pool: asyncpg.Pool | None = None
        self._sql_offset = 0.0
        self._sql_cache = _build_sql(schema, 0.0)

    # -- plumbing -----------------------------------------------------------------------

    @property
    def channel(self) -> str:
        """The NOTIFY channel of this installation (one per schema)."""
        return f"runq_{self.schema}"

    @property
    def _sql(self) -> _Sql:
        # Tests move the clock by assigning clock_offset_seconds; rebuild the texts then.
        if self.clock_offset_seconds != self._sql_offset:
            self._sql_offset = self.clock_offset_seconds
            self._sql_cache = _build_sql(self.schema, self._sql_offset)
        return self._sql_cache

    def _unavailable(self, error: BaseException) -> StoreUnavailable:
        # A failure inside a transaction surfaces as "cannot call Transaction.__aexit__()";
        # the first outage in the chain says what actually happened.
        while isinstance(error.__context__, _UNAVAILABLE):
            error = error.__context__
        detail = str(error) or type(error).__name__
        return StoreUnavailable(f"PostgreSQL at {redact_url(self.url)} is unavailable: {detail}")

    @property
    def _live_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreUnavailable(f"PostgreSQL store {redact_url(self.url)} is not connected")
        return self._pool

    async def _call(self, op: Callable[[asyncpg.Pool], Awaitable[T]], *, retry: bool = False) -> T:
        """Run ``op`` on the pool; map connection failures to ``StoreUnavailable``.

        After a failure every pooled connection is expired, so the next call reconnects
        instead of tripping over the next dead connection of a restarted server. The call
        is tried once more on a fresh connection when that is safe: always for reads
        (``retry``), and for writes only when the client never sent the statement. A write
        that may have reached the server is never repeated: it may have committed.
        """
        pool = self._live_pool
        try:
            return await op(pool)
        except _UNAVAILABLE as e:
            if not _outage(e):
                raise
            await self._expire(pool)
            if not (retry or isinstance(e, _NOT_SENT)):
                raise self._unavailable(e) from e
        try:
            return await op(pool)
        except _UNAVAILABLE as e:
            if not _outage(e):
                raise
            await self._expire(pool)
            raise self._unavailable(e) from e

    @staticmethod
    async def _expire(pool: asyncpg.Pool) -> None:
        # Best effort: the pool replaces a broken connection on its own anyway.
        with contextlib.suppress(Exception):
            await pool.expire_connections()

    async def _fetch(self, sql: str, *args: Any, retry: bool = False) -> list[Any]:
        return await self._call(lambda p: p.fetch(sql, *args), retry=retry)

    async def _fetchrow(self, sql: str, *args: Any, retry: bool = False) -> Any:
        return await self._call(lambda p: p.fetchrow(sql, *args), retry=retry)

    async def _fetchval(self, sql: str, *args: Any, retry: bool = False) -> Any:
        return await self._call(lambda p: p.fetchval(sql, *args), retry=retry)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """One connection inside one transaction, connection failures mapped."""
        pool = self._live_pool
        try:
            async with pool.acquire() as con, con.transaction():
                yield con
        except _UNAVAILABLE as e:
            if not _outage(e):
                raise
            await self._expire(pool)
            raise self._unavailable(e) from e

    def _run(self, row: Any) -> Run:
        return common.row_to_run(row, self._sealer)

    # -- lifecycle ----------------------------------------------------------------------

    async def connect(self) -> None:
        if self._pool is not None:
            return
        try:
            self._pool = await asyncpg.create_pool(
                self.url,
                min_size=self._min_size,
                max_size=self._max_size,
                command_timeout=self._command_timeout,
                timeout=self._connect_timeout,
                reset=_reset_connection,
                server_settings={
                    "application_name": self._application_name,
                    # Queue statements are short OLTP; JIT compilation only adds latency.
                    "jit": "off",
                    # Plan each prepared statement once. Custom plans re-plan the claim on
                    # every call (about a third of its cost), and only because a generic
                    # plan cannot see LIMIT $n and over-estimates it; every statement here
                    # is written to get the same index paths in its generic plan (primary
                    # key probes via = ANY, literal LIMITs where they steer the plan; see
                    # bench/CLAIM_EXPLAIN.md).
                    "plan_cache_mode": "force_generic_plan",
                },
            )
        except _CONNECT_ERRORS as e:
            raise self._unavailable(e) from e

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), timeout=10)
        except _UNAVAILABLE:  # includes TimeoutError: connections that will not close
            pool.terminate()

    async def migrate(self) -> int:
        """Apply pending migrations in one transaction under a per-schema advisory lock.

        The lock is taken before ``CREATE SCHEMA``: two replicas creating the same schema
        at once would otherwise race on pg_namespace's unique index.
        """
        migrations = common.load_migrations("postgres")
        s = self.schema
        async with self._transaction() as con:
            timeout = self._migration_timeout
            await con.execute("SELECT pg_advisory_xact_lock(hashtext('runq:' || $1))", s)
            await con.execute(f"CREATE SCHEMA IF NOT EXISTS {s}", timeout=timeout)
            await con.execute(
                f"CREATE TABLE IF NOT EXISTS {s}.schema_migrations ("
                "version integer PRIMARY KEY, name text NOT NULL, "
                "applied_at double precision NOT NULL)"
            )
            done = {
                r["version"] for r in await con.fetch(f"SELECT version FROM {s}.schema_migrations")
            }
            applied = 0
            for m in migrations:
                if m.version in done:
                    continue
                await con.execute(m.sql.replace("{schema}", s), timeout=timeout)
                await con.execute(
                    f"INSERT INTO {s}.schema_migrations (version, name, applied_at) "
                    f"VALUES ($1, $2, {_clock(self.clock_offset_seconds)})",
                    m.version,
                    m.name,
                )
                applied += 1
            return applied

    async def schema_is_current(self) -> bool:
        wanted = {m.version for m in common.load_migrations("postgres")}
        table = f"{self.schema}.schema_migrations"

        async def read(pool: asyncpg.Pool) -> set[int]:
            async with pool.acquire() as con:
                if await con.fetchval("SELECT to_regclass($1) IS NOT NULL", table) is False:
                    return set()
                return {r["version"] for r in await con.fetch(f"SELECT version FROM {table}")}

        return wanted <= await self._call(read, retry=True)

    async def ping(self) -> None:
        await self._fetchval("SELECT 1", retry=True)

    async def now(self) -> float:
        value: float = await self._fetchval(self._sql.now, retry=True)
        return value

    async def notify(self, payload: str) -> None:
        """NOTIFY this installation's channel (the postgres transport's wake-up)."""
        await self._fetchval(self._sql.notify, self.channel, payload)

    # -- producer -----------------------------------------------------------------------

    async def submit(
        self, new: NewRun, *, max_queue_depth: int, wake: bool = False
    ) -> SubmitResult:
        run_id = new.id or new_run_id()
        # Encode before any SQL: a value that is not JSON raises InvalidPayload, nothing written.
        encoded = common.encode_json(new.payload) if new.save_request else None
        payload = common.seal_encoded(self._sealer, "payload", run_id, encoded)
        args = (
            run_id,
            new.component_type,
            new.component_id,
            new.max_attempts,
            new.priority,
            new.session_id,
            new.actor.user_id,
            common.encode_actor(new.actor),
            new.configuration,
            new.deployment_id or "",
            new.idempotency_key,
            new.origin,
            max(float(new.delay_seconds), 0.0),
            new.save_request,
            payload,
            max(max_queue_depth, 0),
            self.channel if wake else None,
        )
        for _ in range(_SUBMIT_ATTEMPTS):
            try:
                row = await self._fetchrow(self._sql.submit, *args)
            except asyncpg.UniqueViolationError as e:  # the primary key: an explicit id reused
                raise Conflict(f"run {run_id} already exists") from e
            if row["id"] is not None:
                return SubmitResult(self._run(row), True)
            if row["existing_id"] is not None:
                return await self._existing(new, row["existing_id"], row["existing_component"])
            if row["queue_full"]:
                raise QueueFull(common.queue_full(max_queue_depth))
            # Lost an idempotency race to a transaction that committed meanwhile: go again.
        raise StoreUnavailable(
            f"submit of idempotency key {new.idempotency_key!r} kept racing; try again"
        )

    async def _existing(self, new: NewRun, run_id: str, component: str) -> SubmitResult:
        if component != f"{new.component_type}/{new.component_id}":
            raise IdempotencyConflict(
                common.idempotency_conflict(new.idempotency_key or "", component)
            )
        run = await self.get(run_id)
        if run is None:  # purged between the two statements; extremely unlikely
            raise StoreUnavailable(f"run {run_id} vanished while answering its idempotency key")
        return SubmitResult(run, False)

    async def submit_many(self, news: Sequence[NewRun]) -> list[str]:
        ids = [n.id or new_run_id() for n in news]
        columns = self._bulk_columns(news, ids)
        if not ids:
            return ids
        try:
            async with self._transaction() as con:
                for start in range(0, len(ids), _BULK_CHUNK):
                    chunk = [col[start : start + _BULK_CHUNK] for col in columns]
                    await con.execute(self._sql.submit_many, *chunk)
        except asyncpg.UniqueViolationError as e:
            raise Conflict(f"bulk insert refused (duplicate id or idempotency key): {e}") from e
        return ids

    def _bulk_columns(self, news: Sequence[NewRun], ids: list[str]) -> list[list[Any]]:
        """Column arrays for the unnest INSERT; every payload encoded and sealed up front."""
        seal = self._sealer.seal
        encode = common.encode_json
        actors: dict[Any, str] = {}
        cols: list[list[Any]] = [[] for _ in range(15)]
        for run_id, n in zip(ids, news, strict=True):
            actor = actors.get(n.actor)
            if actor is None:
                actor = actors[n.actor] = common.encode_actor(n.actor)
            payload = seal("payload", run_id, encode(n.payload)) if n.save_request else None
            row = (
                run_id,
                n.component_type,
                n.component_id,
                n.max_attempts,
                n.priority,
                n.session_id,
                n.actor.user_id,
                actor,
                n.configuration,
                n.deployment_id or "",
                n.idempotency_key,
                n.origin,
                max(float(n.delay_seconds), 0.0),
                n.save_request,
                payload,
            )
            for col, value in zip(cols, row, strict=True):
                col.append(value)
        return cols

    async def get(self, run_id: str) -> Run | None:
        row = await self._fetchrow(self._sql.get, run_id, retry=True)
        return None if row is None else self._run(row)

    async def _refusal(self, run_id: str) -> Run:
        """The run as it is now, for deciding why a conditional UPDATE matched nothing."""
        run = await self.get(run_id)
        if run is None:
            raise NotFound(common.not_found(run_id))
        return run

    async def cancel(self, run_id: str) -> Run:
        row = await self._fetchrow(self._sql.cancel, run_id)
        if row is not None:
            return self._run(row)
        run = await self._refusal(run_id)
        if run.status == Status.CANCELLED:
            return run
        raise Conflict(common.cancel_refused(run_id, run.status.value))

    async def continue_(self, run_id: str, decision: Any) -> Run:
        sealed = common.seal_json(self._sealer, "decision", run_id, decision)
        row = await self._fetchrow(self._sql.continue_, run_id, sealed)
        if row is not None:
            return self._run(row)
        row = await self._fetchrow(self._sql.get, run_id, retry=True)
        if row is None:
            raise NotFound(common.not_found(run_id))
        # A second continue of the same pause: its continuation is queued or running.
        if (
            row["status"] in (Status.QUEUED, Status.RUNNING)
            and row["continued_at"] is not None
            and row["decision"] is not None
        ):
            return self._run(row)
        raise Conflict(common.continue_refused(run_id, row["status"]))

    async def requeue(
        self, run_id: str, *, clear_cancellation: bool, force: bool, lock_grace_seconds: float
    ) -> Run:
        row = await self._fetchrow(
            self._sql.requeue, run_id, clear_cancellation, force, float(lock_grace_seconds)
        )
        if row is not None:
            return self._run(row)
        run = await self._refusal(run_id)
        if run.status not in TRANSITIONS["requeue"].sources:
            raise InvalidTransition(common.requeue_refused(run_id, run.status.value))
        raise Conflict(common.requeue_too_soon(run_id, lock_grace_seconds))

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
    ) -> list[Run]:
        if slots <= 0:
            return []
        sql = self._sql
        rules = [serialize_sessions, *_blocked_params(blocked)]
        if run_id is not None:
            rows = await self._fetch(sql.claim_one, worker_id, run_id, *rules, deployment_id or "")
        elif deployment_id:
            rows = await self._fetch(sql.claim_affinity, worker_id, slots, *rules, deployment_id)
        else:
            rows = await self._fetch(sql.claim, worker_id, slots, *rules)
        runs = [self._run(r) for r in rows]
        # RETURNING order is the join's, not the claim order; callers start runs in order.
        runs.sort(key=lambda r: (r.priority, r.available_at, r.id))
        return runs

    async def heartbeat_many(self, worker_id: str, leases: Sequence[Lease]) -> HeartbeatResult:
        # Sorted by id, so concurrent batches of one worker lock rows in the same order.
        ordered = sorted(leases, key=lambda le: le.run_id)
        rows = await self._fetch(
            self._sql.heartbeat,
            worker_id,
            [le.run_id for le in ordered],
            [le.attempt for le in ordered],
        )
        renewed = {(r["id"], r["attempt"]) for r in rows}
        return HeartbeatResult(
            renewed=tuple(le for le in leases if (le.run_id, le.attempt) in renewed),
            lost=tuple(le for le in leases if (le.run_id, le.attempt) not in renewed),
            cancel_requested=tuple(sorted(r["id"] for r in rows if r["cancel_requested"])),
        )

    async def complete_many(self, worker_id: str, completions: Sequence[Completion]) -> FenceResult:
        if not completions:
            return FenceResult()
        ordered = sorted(completions, key=lambda c: c.run_id)
        rows = await self._fetch(
            self._sql.complete,
            worker_id,
            [c.run_id for c in ordered],
            [c.attempt for c in ordered],
            [_seal_answer(self._sealer, c) for c in ordered],
            [c.termination_reason.value for c in ordered],
        )
        done = {r["id"] for r in rows}
        return FenceResult(
            applied=tuple(c.run_id for c in completions if c.run_id in done),
            fenced_off=tuple(c.run_id for c in completions if c.run_id not in done),
        )

    async def fail(
        self,
        worker_id: str,
        lease: Lease,
        *,
        error: str,
        retryable: bool,
        retry_in_seconds: float,
    ) -> FailOutcome:
        status = await self._fetchval(
            self._sql.fail,
            lease.run_id,
            lease.attempt,
            worker_id,
            retryable,
            max(float(retry_in_seconds), 0.0),
            error,
        )
        if status is None:
            return FailOutcome.FENCED_OFF
        return FailOutcome.RETRY_SCHEDULED if status == "queued" else FailOutcome.DEAD_LETTERED

    async def pause(self, worker_id: str, lease: Lease, *, reason: str, state: Any) -> bool:
        sealed = common.seal_json(self._sealer, "resume_state", lease.run_id, state)
        found = await self._fetchval(
            self._sql.pause, lease.run_id, lease.attempt, worker_id, reason, sealed
        )
        return found is not None

    async def settle_cancelled(self, worker_id: str, lease: Lease) -> bool:
        found = await self._fetchval(
            self._sql.settle_cancelled, lease.run_id, lease.attempt, worker_id
        )
        return found is not None

    async def set_non_idempotent(self, worker_id: str, lease: Lease, inside: bool) -> bool:
        found = await self._fetchval(
            self._sql.set_non_idempotent, lease.run_id, lease.attempt, worker_id, inside
        )
        return found is not None

    async def record_usage(
        self, worker_id: str, lease: Lease, *, tokens: int, cost: float, keys: Sequence[UsageKey]
    ) -> None:
        await self._fetch(
            self._sql.record_usage, *_key_arrays(keys), int(tokens), float(cost), lease.run_id
        )

    async def count_claimed_run(self, keys: Sequence[UsageKey]) -> None:
        if keys:
            await self._fetch(self._sql.count_claimed_run, *_key_arrays(keys))

    async def usage_totals(self, keys: Sequence[UsageKey]) -> dict[UsageKey, UsageTotals]:
        totals = {k: UsageTotals() for k in keys}
        if not keys:
            return totals
        rows = await self._fetch(self._sql.usage_totals, *_key_arrays(keys), retry=True)
        for r in rows:
            key = UsageKey(r["scope"], r["subject"], r["period_start"])
            totals[key] = UsageTotals(cost=r["cost"], tokens=r["tokens"], runs=r["runs"])
        return totals

    async def usage_in_periods(
        self, periods: Sequence[tuple[str, float]]
    ) -> dict[UsageKey, UsageTotals]:
        if not periods:
            return {}
        rows = await self._fetch(
            self._sql.usage_in_periods,
            [scope for scope, _ in periods],
            [float(start) for _, start in periods],
            retry=True,
        )
        return {
            UsageKey(r["scope"], r["subject"], r["period_start"]): UsageTotals(
                cost=r["cost"], tokens=r["tokens"], runs=r["runs"]
            )
            for r in rows
        }

    # -- maintenance --------------------------------------------------------------------

    async def reap_stale(self, *, lock_grace_seconds: float, limit: int) -> ReapReport:
        if limit <= 0:
            return ReapReport()
        row = await self._fetchrow(
            self._sql.reap,
            float(lock_grace_seconds),
            limit,
            common.REAP_NON_IDEMPOTENT_ERROR,
            common.REAP_NO_REQUEST_ERROR,
        )
        requeued, dead = list(row["requeued"]), list(row["dead"])
        return ReapReport(
            requeued=len(requeued),
            dead_lettered=len(dead),
            skipped=row["seen"] - len(requeued) - len(dead),
            requeued_ids=requeued,
            dead_lettered_ids=dead,
        )

    async def purge_final_before(
        self,
        *,
        retention_seconds: float,
        paused_retention_seconds: float,
        batch_size: int = 500,
        max_batches: int = 1000,
    ) -> PurgeReport:
        report = PurgeReport()
        passes = [(self._sql.purge_final, retention_seconds)]
        if paused_retention_seconds > 0:
            passes.append((self._sql.purge_paused, paused_retention_seconds))
        for sql, age in passes:
            while report.batches < max_batches:
                deleted: int = await self._fetchval(sql, float(age), batch_size)
                if deleted:
                    report.batches += 1
                    report.deleted += deleted
                if deleted < batch_size:
                    break
        return report

    async def register_worker(self, info: WorkerInfo) -> None:
        await self._fetch(
            self._sql.register_worker, info.id, info.hostname, info.pid, info.deployment_id or ""
        )

    async def remove_worker(self, worker_id: str) -> None:
        await self._fetch(self._sql.remove_worker, worker_id)

    async def prune_workers(self, *, max_age_seconds: float) -> int:
        pruned: int = await self._fetchval(self._sql.prune_workers, float(max_age_seconds))
        return pruned

    async def list_workers(self, *, max_age_seconds: float) -> list[WorkerInfo]:
        rows = await self._fetch(self._sql.list_workers, float(max_age_seconds), retry=True)
        return [_worker_info(r) for r in rows]

    # -- reads for operators ------------------------------------------------------------

    async def stats(self) -> Stats:
        row = await self._fetchrow(self._sql.stats, retry=True)
        return Stats(
            counts=_counts(row["statuses"], row["ns"]),
            oldest_queued_age_seconds=row["oldest_age"],
        )

    async def health(
        self, *, lock_grace_seconds: float, worker_max_age_seconds: float
    ) -> QueueHealth:
        row = await self._fetchrow(
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
        where, args = self._job_filter(statuses, user_id)
        # Only whitelisted identifiers, our own placeholders and ints are interpolated. The
        # id tie-break keeps pages stable when many rows share the sort value. LIMIT and
        # OFFSET are literals so the (generic) plan knows a page is small and walks an
        # index in sort order instead of sorting every matching row.
        page_sql = (
            f"SELECT * FROM {self.schema}.runs{where} "
            f"ORDER BY {common.order_by_sql(sort_by, sort_order)} "
            f"LIMIT {limit} OFFSET {(page - 1) * limit}"
        )
        count_sql = f"SELECT count(*) FROM {self.schema}.runs{where}"

        async def read(pool: asyncpg.Pool) -> tuple[int, list[Any]]:
            async with pool.acquire() as con:
                total = await con.fetchval(count_sql, *args)
                rows = await con.fetch(page_sql, *args)
                return total, rows

        total, rows = await self._call(read, retry=True)
        return Page(data=[self._run(r) for r in rows], page=page, limit=limit, total_count=total)

    @staticmethod
    def _job_filter(statuses: Sequence[Status], user_id: str | None) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        if statuses:
            # Enum values, quoted by the model: a literal list plans like a custom plan.
            clauses.append(f"status IN ({sql_status_list(frozenset(Status(s) for s in statuses))})")
        if user_id is not None:
            args.append(user_id)
            clauses.append(f"user_id = ${len(args)}")
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), args

    async def reseal_page(self, *, after_id: str, limit: int) -> tuple[str | None, int]:
        async with self._transaction() as con:
            sql = self._sql.reseal_select.format(limit=max(int(limit), 1))
            rows = await con.fetch(sql, after_id)
            if not rows:
                return None, 0
            columns: dict[str, list[bytes | None]] = {c: [] for c in SEALED_COLUMNS}
            resealed = 0
            for row in rows:
                for column in SEALED_COLUMNS:
                    value, changed = self._reseal(column, row["id"], row[column])
                    columns[column].append(value)
                    resealed += changed
            if resealed:
                await con.execute(
                    self._sql.reseal_update,
                    [r["id"] for r in rows],
                    *(columns[c] for c in SEALED_COLUMNS),
                )
            return rows[-1]["id"], resealed

    def _reseal(self, column: str, run_id: str, sealed: bytes | None) -> tuple[bytes | None, int]:
        """The value under the sealing key, and 1 when it had to be re-sealed."""
        if sealed is None or sealed_key_id(sealed) == self._sealer.sealing_key_id:
            return sealed, 0
        plain = self._sealer.open(column, run_id, sealed)
        return self._sealer.seal(column, run_id, plain), 1

    async def count_runs(self) -> int:
        total: int = await self._fetchval(self._sql.count_runs, retry=True)
        return total
