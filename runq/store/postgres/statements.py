"""Every PostgreSQL statement text, built once per (schema, clock offset) by pure functions.

Texts never carry user input (only the schema, checked to be an identifier, enum values and
integers), so asyncpg's per-connection statement cache keeps them prepared. Every time
written comes from the database clock: ``now()`` of the statement's transaction plus the
clock offset, which only tests set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runq.flow import NO_CAP
from runq.model import ACTIVE_STATUSES, FINAL_STATUSES, Status
from runq.store.statements import (
    fenced,
    order_by,
    reap_exhausted_error,
    sources_of,
    status_list,
    target_of,
)

_FINAL = status_list(FINAL_STATUSES)
_ACTIVE = status_list(ACTIVE_STATUSES)  # must imply runs_session_active_idx's predicate
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


def _clock(offset: float) -> str:
    # A float literal keeps the text stable for a given offset (the offset is 0 outside
    # tests), so the statement stays prepared; repr() round-trips the exact value.
    return f"(extract(epoch from now())::float8 + ({float(offset)!r})::float8)"


@dataclass(frozen=True, slots=True)
class Statements:
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
    purge: str
    purge_with_paused: str
    release: str
    migrate_lock: str
    create_schema: str
    create_migrations_table: str
    applied_versions: str
    record_migration: str
    migrations_table_exists: str
    ping: str
    register_worker: str
    remove_worker: str
    prune_workers: str
    list_workers: str
    stats: str
    health: str
    reseal_select_template: str
    reseal_update: str
    notify: str
    ids_with_prefix: str
    # -- flow control: limits, rate windows, pauses ------------------------------------
    claim_limited: str
    claim_limited_affinity: str
    claim_limited_one: str
    limits_lock: str
    running_by_component: str
    rate_windows_get: str
    rate_windows_bump: str
    pause_insert: str
    pause_delete: str
    pause_list: str
    session_ahead: str
    queued_by_component: str
    # -- the fleet's seal key fingerprint -------------------------------------------------
    seal_check_get: str
    seal_check_put: str

    # -- the event log (kept together at the end) --
    events_reserve_many: str
    events_insert_many: str
    events_list: str
    events_trim: str
    events_sealed: str
    events_reseal: str


def _component_name(alias: str) -> str:
    return f"({alias}.component_type || '/' || {alias}.component_id)"


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
            WHERE b.u = coalesce(r.user_id, '') AND b.c = coalesce(r.configuration, ''))
        AND NOT EXISTS (
            SELECT 1 FROM {s}.pauses p
            WHERE (p.kind = 'deployment' AND p.target = r.deployment_id)
               OR (p.kind = 'component' AND {_component_name("r")} LIKE p.like_pattern))"""


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


def _limited_claim_sql(s: str, now: str) -> tuple[str, str, str]:
    """The claim variants used while ``[limits]`` are configured: (no deployment, with a
    deployment, one run by id).

    Parameters as in ``_claim_sql`` ($8 the deployment, '' when none), then $9 the limit
    patterns in LIKE form, most specific first, and $10 each pattern's room (runs it may
    still start); $11 each pattern's ``max_running_per_key`` and, for the keys running now,
    $12 group, $13 key, $14 running count. A run's group is the first pattern it matches.
    Runs of a group (or key) with no room are filtered inside the index walk, so they
    neither fill the LIMIT nor hold up the runs behind them; among the candidates, at most
    ``room`` per group and per key are taken. Callers hold the limits lock, so the room
    they computed cannot be spent by another claimer before this statement commits.
    """
    filters = _claim_filters(s, now, 3)
    group = f"""(SELECT p.i FROM unnest($9::text[]) WITH ORDINALITY AS p(pat, i)
               WHERE {_component_name("r")} LIKE p.pat ORDER BY p.i LIMIT 1)"""
    key_room = f"""CASE WHEN r.concurrency_key IS NULL OR g.i IS NULL THEN {NO_CAP}
        ELSE ($11::int[])[g.i] - coalesce((
            SELECT k.n FROM unnest($12::int[], $13::text[], $14::int[]) AS k(g, key, n)
            WHERE k.g = g.i AND k.key = r.concurrency_key), 0) END"""
    has_room = f"coalesce(($10::int[])[g.i], 1) > 0 AND {key_room} > 0"
    columns = (
        f"r.id, r.priority, r.available_at, g.i AS grp, r.concurrency_key AS ckey,"
        f" {key_room} AS kroom"
    )

    def branch(dep: str) -> str:
        return (
            f"SELECT {columns} FROM {s}.runs r CROSS JOIN LATERAL (SELECT {group} AS i) g "
            f"WHERE r.status = 'queued' AND r.deployment_id = {dep} AND {filters} "
            f"AND {has_room} "
            "ORDER BY r.priority, r.available_at, r.id LIMIT $2 FOR UPDATE OF r SKIP LOCKED"
        )

    def capped(candidates: str) -> str:
        return f"""
        SELECT w.id FROM (
            SELECT m.*,
                row_number() OVER (
                    PARTITION BY m.grp ORDER BY m.priority, m.available_at, m.id) AS nth,
                row_number() OVER (
                    PARTITION BY m.grp, m.ckey ORDER BY m.priority, m.available_at, m.id) AS knth
            FROM ({candidates}) AS m
        ) AS w
        WHERE (w.grp IS NULL OR w.nth <= ($10::int[])[w.grp])
          AND (w.ckey IS NULL OR w.knth <= w.kroom)
        ORDER BY w.priority, w.available_at, w.id LIMIT $2"""

    no_dep, ours = branch("''"), branch("$8")
    # ``$8`` is named in every variant so the parameters keep one numbering.
    plain = capped(f"SELECT * FROM ({no_dep}) AS a WHERE $8::text IS NOT NULL")
    merged = capped(f"SELECT * FROM ({no_dep}) AS a UNION ALL SELECT * FROM ({ours}) AS b")
    one = capped(
        f"SELECT {columns} FROM {s}.runs r CROSS JOIN LATERAL (SELECT {group} AS i) g "
        f"WHERE r.id = $2 AND r.status = 'queued' AND r.deployment_id IN ('', $8) "
        f"AND {filters} AND {has_room} FOR UPDATE OF r SKIP LOCKED"
    ).replace("LIMIT $2", "LIMIT 1")
    return (
        _claim_update(s, now, plain),
        _claim_update(s, now, merged),
        _claim_update(s, now, one),
    )


def _flow_sql(s: str, now: str) -> dict[str, str]:
    return {
        # One lock per schema serializes the claimers that apply limits: each one counts
        # the running runs after the previous one committed, so none can over-admit.
        "limits_lock": "SELECT pg_advisory_xact_lock(hashtext($1))",
        # The clock rides along (a first row with no component), saving a round trip
        # inside the limits lock.
        "running_by_component": (
            f"SELECT {now} AS now, NULL::text AS component, NULL::text AS concurrency_key,"
            " 0::bigint AS n UNION ALL"
            f" SELECT NULL, {_component_name('r')}, r.concurrency_key, count(*)"
            f" FROM {s}.runs r WHERE r.status = 'running' GROUP BY 2, 3"
        ),
        "rate_windows_get": (
            f"SELECT pattern, window_start, used FROM {s}.rate_windows"
            " WHERE pattern = ANY($1::text[])"
        ),
        # $1 patterns, $2 window starts, $3 starts to add; a new window starts over.
        "rate_windows_bump": f"""
            INSERT INTO {s}.rate_windows AS w (pattern, window_start, used)
            SELECT * FROM unnest($1::text[], $2::float8[], $3::int[])
            ON CONFLICT (pattern) DO UPDATE SET
                used = CASE WHEN w.window_start = EXCLUDED.window_start
                            THEN w.used + EXCLUDED.used ELSE EXCLUDED.used END,
                window_start = EXCLUDED.window_start""",
        # $1 id, $2 kind, $3 target, $4 LIKE form, $5 reason, $6 by. A second pause of the
        # same target returns the existing row.
        "pause_insert": f"""
            WITH ins AS (
                INSERT INTO {s}.pauses (id, kind, target, like_pattern, reason, created_by,
                                        created_at)
                VALUES ($1, $2, $3, $4, $5, $6, {now})
                ON CONFLICT (kind, target) DO NOTHING
                RETURNING *, true AS created
            )
            SELECT * FROM ins
            UNION ALL
            SELECT *, false AS created FROM {s}.pauses WHERE kind = $2 AND target = $3
              AND NOT EXISTS (SELECT 1 FROM ins)""",
        "pause_delete": f"DELETE FROM {s}.pauses WHERE id = $1 OR (kind = $2 AND target = $3)"
        " RETURNING *",
        "pause_list": f"SELECT * FROM {s}.pauses ORDER BY created_at, id",
        # The session rule for one run ($1 id, $2 session): an older active run of its
        # session, or one running or paused, holds it back.
        "session_ahead": f"""
            SELECT EXISTS (SELECT 1 FROM {s}.runs o
            WHERE o.session_id = $2 AND o.status IN ({_ACTIVE}) AND o.id <> $1
              AND (o.id < $1 OR o.status <> 'queued'))""",
        # Queued runs per (component, deployment): ready now, and delayed.
        "queued_by_component": f"""
            SELECT {_component_name("r")} AS component, r.deployment_id,
                   count(*) FILTER (WHERE r.available_at <= {now}) AS ready,
                   count(*) FILTER (WHERE r.available_at > {now}) AS delayed
            FROM {s}.runs r WHERE r.status = 'queued' GROUP BY 1, 2""",
    }


def _reap_sql(s: str, now: str) -> str:
    """The reaper's rules as one statement.

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
                    WHEN u.attempt >= u.max_attempts THEN {reap_exhausted_error()}
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
    "updated_at, available_at, has_request, payload, concurrency_key"
)


def _submit_sql(s: str, now: str) -> str:
    """Idempotency lookup, depth gate and insert in one round trip.

    $1 id, $2 type, $3 component id, $4 max_attempts, $5 priority, $6 session, $7 user,
    $8 actor, $9 configuration, $10 deployment, $11 idempotency key, $12 origin,
    $13 delay, $14 has_request, $15 payload, $16 max_queue_depth (0 = unbounded),
    $17 the NOTIFY channel when the insert should wake the listeners (NULL: no NOTIFY),
    $18 concurrency_key, $19 max_delayed, $20 max_queued_per_user (0 = unbounded).
    A due run is gated by the due runs ($16) and a delayed one by the delayed runs ($19), so
    runs far in the future cannot fill the queue for everyone; a user's queued runs are gated
    by $20. Each count stops at its limit (a bounded walk of the queued rows).
    ON CONFLICT covers a concurrent submit of the same key: nothing is returned then and
    the caller re-runs the statement, which now sees the winner in ``existing``.
    """
    return f"""
        WITH existing AS (
            SELECT id, component_type, component_id FROM {s}.runs
            WHERE idempotency_key = $11 AND coalesce(user_id, '') = coalesce($7, '')
        ),
        gate AS (
            SELECT CASE WHEN $13::float8 > 0 THEN $19::bigint > 0 AND (
                SELECT count(*) FROM (
                    SELECT 1 FROM {s}.runs
                    WHERE status = 'queued' AND available_at > {now} LIMIT $19::bigint
                ) AS q
            ) >= $19::bigint ELSE $16::bigint > 0 AND (
                SELECT count(*) FROM (
                    SELECT 1 FROM {s}.runs
                    WHERE status = 'queued' AND available_at <= {now} LIMIT $16::bigint
                ) AS q
            ) >= $16::bigint END AS is_full,
            $20::bigint > 0 AND $7::text IS NOT NULL AND (
                SELECT count(*) FROM (
                    SELECT 1 FROM {s}.runs
                    WHERE user_id = $7 AND status = 'queued' LIMIT $20::bigint
                ) AS u
            ) >= $20::bigint AS user_full
        ),
        ins AS (
            INSERT INTO {s}.runs ({_INSERT_COLUMNS})
            SELECT $1, $2, $3, 'queued', 0, $4, $5, $6, $7, $8, $9, $10, $11, $12,
                   {now}, {now}, {now} + $13::float8, $14, $15, $18::text
            WHERE NOT EXISTS (SELECT 1 FROM existing)
              AND NOT (SELECT is_full OR user_full FROM gate)
            ON CONFLICT (idempotency_key, (coalesce(user_id, '')))
                WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING *
        )
        SELECT ins.*,
               (SELECT id FROM existing) AS existing_id,
               (SELECT component_type || '/' || component_id FROM existing)
                   AS existing_component,
               (SELECT is_full FROM gate) AS queue_full,
               (SELECT user_full FROM gate) AS user_full,
               CASE WHEN $17::text IS NOT NULL AND ins.id IS NOT NULL
                    THEN pg_notify($17::text, 'wake') IS NULL END AS notified
        FROM (SELECT 1) AS one LEFT JOIN ins ON true"""


def _submit_many_sql(s: str, now: str) -> str:
    return f"""
        INSERT INTO {s}.runs ({_INSERT_COLUMNS})
        SELECT v.id, v.ct, v.ci, 'queued', 0, v.ma, v.pr, v.sid, v.uid, v.actor, v.conf,
               v.dep, v.key, v.origin, {now}, {now}, {now} + v.delay, v.hr, v.payload, v.ck
        FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::int[], $6::text[],
                    $7::text[], $8::text[], $9::text[], $10::text[], $11::text[],
                    $12::text[], $13::float8[], $14::bool[], $15::bytea[], $16::text[])
            AS v(id, ct, ci, ma, pr, sid, uid, actor, conf, dep, key, origin, delay, hr, payload,
                 ck)"""


def _fenced(verb: str, alias: str = "") -> str:
    """The lease fence of a worker's single-lease write: $1 id, $2 attempt, $3 worker.
    A write fenced on the exact attempt and holder cannot land on a run that was reaped
    and claimed again by someone else meanwhile."""
    fenced(verb)
    p = f"{alias}." if alias else ""
    return f"{p}id = $1 AND {p}attempt = $2 AND {p}locked_by = $3 AND {_still_running(alias)}"


def _lifecycle_sql(s: str, now: str) -> dict[str, str]:
    """Operator and producer transitions (cancel, continue, requeue)."""
    cancel_src = sources_of("cancel")
    requeue_src = sources_of("requeue")
    return {
        # queued/paused: cancelled at once; running: intent only. The cancel is recorded in
        # both cases, so an operator requeue keeps it unless told to clear it.
        "cancel": f"""
            UPDATE {s}.runs SET
                cancel_requested = true, updated_at = {now},
                status = CASE WHEN status IN ({cancel_src})
                    THEN {target_of("cancel")} ELSE status END,
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
                status = {target_of("continue")}, decision = $2,
                max_attempts = GREATEST(max_attempts, attempt + 1),
                available_at = {now}, continued_at = {now}, updated_at = {now}
            WHERE id = $1 AND (status = 'paused') IS TRUE  -- by primary key, see _still_running
            RETURNING *""",
        "requeue": f"""
            UPDATE {s}.runs SET
                status = {target_of("requeue")}, max_attempts = attempt + 1, available_at = {now},
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
                status = {target_of("complete")}, answer = v.answer, termination_reason = v.reason,
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
            WHERE {_fenced("fail")}
            RETURNING status""",
        "pause": f"""
            UPDATE {s}.runs SET
                status = {target_of("pause")}, pause_reason = $4, resume_state = $5,
                decision = NULL, continued_at = NULL, locked_by = NULL, locked_at = NULL,
                updated_at = {now}
            WHERE {_fenced("pause")}
            RETURNING id""",
        "settle_cancelled": f"""
            UPDATE {s}.runs SET
                status = {target_of("settle_cancelled")}, termination_reason = 'cancelled',
                completed_at = {now}, resume_state = NULL, decision = NULL,
                locked_by = NULL, locked_at = NULL, updated_at = {now}
            WHERE {_fenced("settle_cancelled")}
            RETURNING id""",
        "set_non_idempotent": f"""
            UPDATE {s}.runs SET non_idempotent = $4
            WHERE {_fenced("set_non_idempotent")}
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

    final = f"status IN ({_FINAL}) AND completed_at < {now} - $1::float8"
    paused = f"status = 'paused' AND updated_at < {now} - $3::float8"

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
        # $1 final retention, $2 batch size; $3 paused retention (only when it is on).
        "purge": purge(final),
        # Each kind walks its own partial index and stops at the batch size (one OR would
        # make a bitmap of the whole backlog for every batch); the outer predicate is what
        # FOR UPDATE rechecks on the newest row version.
        "purge_with_paused": purge(
            f"id = ANY(ARRAY((SELECT id FROM {s}.runs WHERE {final} LIMIT $2)"
            f" UNION ALL (SELECT id FROM {s}.runs WHERE {paused} LIMIT $2)))"
            # IS TRUE: the same test, but no index qual, so the ids are probed by key.
            f" AND (({final}) OR ({paused})) IS TRUE"
        ),
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
        "reseal_select_template": f"""
            SELECT id, payload, answer, resume_state, decision FROM {s}.runs
            WHERE id > $1 ORDER BY id LIMIT {{limit}} FOR NO KEY UPDATE""",
        "reseal_update": f"""
            UPDATE {s}.runs AS r SET payload = v.payload, answer = v.answer,
                resume_state = v.resume_state, decision = v.decision
            FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::bytea[], $5::bytea[])
                AS v(id, payload, answer, resume_state, decision)
            WHERE r.id = v.id""",
    }


def _migration_sql(s: str, now: str) -> dict[str, str]:
    """The bookkeeping around the migration scripts (the scripts are package data)."""
    return {
        # Taken before CREATE SCHEMA: two replicas creating the same schema at once would
        # otherwise race on pg_namespace's unique index.
        "migrate_lock": "SELECT pg_advisory_xact_lock(hashtext('runq:' || $1))",
        "create_schema": f"CREATE SCHEMA IF NOT EXISTS {s}",
        "create_migrations_table": f"""
            CREATE TABLE IF NOT EXISTS {s}.schema_migrations (
                version integer PRIMARY KEY, name text NOT NULL,
                applied_at double precision NOT NULL)""",
        "applied_versions": f"SELECT version FROM {s}.schema_migrations",
        "record_migration": f"""
            INSERT INTO {s}.schema_migrations (version, name, applied_at)
            VALUES ($1, $2, {now})""",
        "migrations_table_exists": f"SELECT to_regclass('{s}.schema_migrations') IS NOT NULL",
    }


def _release_sql(s: str, now: str) -> str:
    """Give claimed runs back (fenced on the lease the claim took): queued again with the
    attempt restored, the reason recorded in ``error`` when not NULL. $1 worker, $2 ids,
    $3 attempts, $4 reasons."""
    return f"""
        UPDATE {s}.runs AS r SET
            status = 'queued', attempt = r.attempt - 1,
            started_at = CASE WHEN r.attempt = 1 THEN NULL ELSE r.started_at END,
            error = coalesce(v.reason, r.error), updated_at = {now},
            locked_by = NULL, locked_at = NULL
        FROM unnest($2::text[], $3::int[], $4::text[]) AS v(id, attempt, reason)
        WHERE r.id = v.id AND r.attempt = v.attempt AND r.locked_by = $1
          AND {_still_running("r")}"""


def _events_sql(s: str, now: str) -> dict[str, str]:
    """The event log. Lifecycle events are written by the triggers of migration 0004; a
    handler's batch reserves its numbers by moving ``runs.event_seq`` under the fence (the
    row lock orders it with every other writer of the run), then inserts the sealed rows in
    the same transaction."""
    fenced("append_events")
    return {
        # $1 worker, then ids, attempts, counts. Rows are locked in id order, so two batches
        # never wait on each other crosswise. Returns each run's last number reserved.
        "events_reserve_many": f"""
            WITH v AS (
                SELECT * FROM unnest($2::text[], $3::int[], $4::bigint[]) AS v(id, attempt, n)
            ),
            locked AS MATERIALIZED (
                SELECT r.id FROM {s}.runs r JOIN v ON r.id = v.id AND r.attempt = v.attempt
                WHERE r.locked_by = $1 AND {_still_running("r")}
                ORDER BY r.id FOR NO KEY UPDATE OF r
            )
            UPDATE {s}.runs AS r SET event_seq = r.event_seq + v.n
            FROM v WHERE r.id = v.id AND r.id = ANY(ARRAY(SELECT id FROM locked))
            RETURNING r.id, r.event_seq""",
        # run ids, attempts, seqs, kinds, sealed data; $6 the NOTIFY channel: one
        # notification per run, naming its last seq.
        "events_insert_many": f"""
            WITH v AS (
                SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[], $5::bytea[])
                    AS v(run_id, attempt, seq, kind, data)
            ),
            ins AS (
                INSERT INTO {s}.run_events (run_id, seq, attempt, at, kind, data)
                SELECT run_id, seq, attempt, {now}, kind, data FROM v
            )
            SELECT count(pg_notify($6::text, 'event:' || run_id || ':' || last))
            FROM (SELECT run_id, max(seq) AS last FROM v GROUP BY run_id) AS l""",
        "events_list": f"""
            SELECT seq, attempt, at, kind, info::text AS info, data FROM {s}.run_events
            WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3""",
        # $2: drop lifecycle details too (level none).
        "events_trim": f"""
            UPDATE {s}.run_events SET data = NULL, info = CASE WHEN $2::bool THEN NULL ELSE info END
            WHERE run_id = $1 AND (data IS NOT NULL OR ($2::bool AND info IS NOT NULL))""",
        "events_sealed": f"""
            SELECT seq, data FROM {s}.run_events WHERE run_id = $1 AND data IS NOT NULL
            ORDER BY seq""",
        "events_reseal": f"""
            UPDATE {s}.run_events AS e SET data = v.data
            FROM unnest($2::bigint[], $3::bytea[]) AS v(seq, data)
            WHERE e.run_id = $1 AND e.seq = v.seq""",
    }


def build(schema: str, offset: float) -> Statements:
    """Every statement of one schema at one clock offset."""
    s, now = schema, _clock(offset)
    claim, claim_affinity, claim_one = _claim_sql(s, now)
    limited, limited_affinity, limited_one = _limited_claim_sql(s, now)
    return Statements(
        now=f"SELECT {now}",
        ping="SELECT 1",
        get=f"SELECT * FROM {s}.runs WHERE id = $1",
        count_runs=f"SELECT count(*) FROM {s}.runs",
        release=_release_sql(s, now),
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
        **_migration_sql(s, now),
        # starts_with is exact under any collation (a range on a non-C collation is not);
        # an operator's one-off lookup can afford the scan.
        ids_with_prefix=f"SELECT id FROM {s}.runs WHERE starts_with(id, $1) ORDER BY id LIMIT $2",
        claim_limited=limited,
        claim_limited_affinity=limited_affinity,
        claim_limited_one=limited_one,
        **_flow_sql(s, now),
        seal_check_get=f"SELECT key_id FROM {s}.seal_check WHERE id = 1 FOR UPDATE",
        seal_check_put=(
            f"INSERT INTO {s}.seal_check (id, key_id, updated_at) VALUES (1, $1, {now})"
            " ON CONFLICT (id) DO UPDATE SET key_id = excluded.key_id,"
            " updated_at = excluded.updated_at"
        ),
        **_events_sql(s, now),
    )


def reseal_select(statements: Statements, limit: int) -> str:
    """The rotation page read with a literal LIMIT (an int, never user text)."""
    return statements.reseal_select_template.format(limit=max(int(limit), 1))


def list_jobs(
    schema: str,
    *,
    statuses: Sequence[Status],
    by_user: bool,
    sort_by: str,
    sort_order: str,
    limit: int,
    offset: int,
) -> tuple[str, str]:
    """(page, count) of the operator listing; ``$1`` is the user id when ``by_user``.

    Only whitelisted identifiers, enum values and ints are interpolated. The status list is
    literal so it plans like a custom plan; LIMIT and OFFSET are literals so the (generic)
    plan knows a page is small and walks an index in sort order instead of sorting every
    matching row. The id tie-break keeps pages stable when many rows share the sort value.
    """
    clauses: list[str] = []
    if statuses:
        clauses.append(f"status IN ({status_list(frozenset(Status(x) for x in statuses))})")
    if by_user:
        clauses.append("user_id = $1")
    where = " WHERE " + " AND ".join(clauses) if clauses else ""
    page = (
        f"SELECT * FROM {schema}.runs{where} ORDER BY {order_by(sort_by, sort_order)} "
        f"LIMIT {int(limit)} OFFSET {int(offset)}"
    )
    return page, f"SELECT count(*) FROM {schema}.runs{where}"


# -- bulk submit through binary COPY ---------------------------------------------------------

#: The columns ``PostgresStore.submit_many`` copies into the run table, in record order: what
#: the single submit's INSERT writes, with the transaction's clock filled in by the caller.
SUBMIT_COPY_COLUMNS: tuple[str, ...] = tuple(c.strip() for c in _INSERT_COLUMNS.split(","))
# -- schedules and unique runs -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleStatements:
    """Statements of schedules and unique runs, kept apart from the run-table verbs."""

    schedule_states: str
    fire_slot: str
    advance_cursor: str
    set_paused: str
    unique_lock: str
    unique_set: str
    recent_slots: str
    prune_slots: str


def _fire_slot_sql(s: str, now: str) -> str:
    """Record one slot of a schedule and insert its run in one statement.

    $1 schedule, $2 slot time, $3 skip while the previous run is not final (overlap =
    "skip"), then the run's columns as in ``_submit_sql`` from $4 (id) to $18 (payload).
    The schedule row is locked first, so replicas firing the same schedule take turns; the
    slot's primary key is what makes a slot fire once: a replica that comes second inserts
    nothing and so makes no run. Slot, run and schedule row commit together, so a replica
    killed mid-statement leaves either all three or none.
    """
    return f"""
        WITH st AS MATERIALIZED (
            SELECT last_run_id FROM {s}.schedules WHERE name = $1 FOR UPDATE
        ),
        busy AS MATERIALIZED (
            SELECT $3::bool AND EXISTS (
                SELECT 1 FROM {s}.runs r
                WHERE r.id = (SELECT last_run_id FROM st) AND r.status IN ({_ACTIVE})
            ) AS b
        ),
        slot AS (
            INSERT INTO {s}.schedule_slots (schedule, slot_at, run_id, fired_at)
            SELECT $1, $2::float8, CASE WHEN (SELECT b FROM busy) THEN NULL ELSE $4 END, {now}
            WHERE EXISTS (SELECT 1 FROM st)
            ON CONFLICT (schedule, slot_at) DO NOTHING
            RETURNING run_id
        ),
        ins AS (
            INSERT INTO {s}.runs ({_INSERT_COLUMNS})
            SELECT $4, $5, $6, 'queued', 0, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                   {now}, {now}, {now} + $16::float8, $17, $18, NULL::text
            FROM slot WHERE slot.run_id IS NOT NULL
            RETURNING id
        ),
        upd AS (
            UPDATE {s}.schedules SET
                last_run_id = CASE WHEN EXISTS (SELECT 1 FROM ins)
                    AND $2::float8 >= coalesce(last_slot_at, $2::float8)
                    THEN $4 ELSE last_run_id END,
                last_slot_at = greatest(coalesce(last_slot_at, $2::float8), $2::float8),
                last_fire_at = {now},
                cursor_at = greatest(cursor_at, $2::float8),
                updated_at = {now}
            WHERE name = $1 AND EXISTS (SELECT 1 FROM slot)
        )
        SELECT (SELECT count(*) FROM slot) AS recorded, (SELECT min(id) FROM ins) AS run_id"""


def build_schedules(schema: str, offset: float) -> ScheduleStatements:
    """The schedule and unique-run statements of one schema at one clock offset."""
    s, now = schema, _clock(offset)
    return ScheduleStatements(
        # A schedule seen for the first time starts counting its slots from now, so a new
        # schedule never fires for the past. $1 names.
        schedule_states=f"""
            WITH ins AS (
                INSERT INTO {s}.schedules (name, cursor_at, updated_at)
                SELECT n, {now}, {now} FROM unnest($1::text[]) AS n
                ON CONFLICT (name) DO NOTHING
                RETURNING *
            )
            SELECT x.*, {now} AS db_now FROM (
                SELECT * FROM {s}.schedules WHERE name = ANY($1::text[])
                UNION ALL SELECT * FROM ins
            ) AS x""",
        fire_slot=_fire_slot_sql(s, now),
        # Only forward: a replica with an older view never moves the cursor back.
        advance_cursor=f"""
            UPDATE {s}.schedules SET cursor_at = $2::float8, updated_at = {now}
            WHERE name = $1 AND cursor_at < $2::float8""",
        # Resuming moves the cursor to now: slots that fell inside the pause do not fire.
        set_paused=f"""
            INSERT INTO {s}.schedules AS sc (name, paused, paused_at, cursor_at, updated_at)
            VALUES ($1, $2::bool, CASE WHEN $2::bool THEN {now} END, {now}, {now})
            ON CONFLICT (name) DO UPDATE SET
                paused = $2::bool,
                paused_at = CASE WHEN $2::bool THEN coalesce(sc.paused_at, {now}) END,
                cursor_at = CASE WHEN $2::bool THEN sc.cursor_at
                    ELSE greatest(sc.cursor_at, {now}) END,
                updated_at = {now}
            RETURNING *""",
        # The lock row of a unique key: inserted or, when present, locked (the no-op update
        # takes the row lock) so concurrent submitters of one key are served one at a time.
        # $1 component, $2 key. Returns the run the key names (NULL: none yet) and the clock.
        unique_lock=f"""
            INSERT INTO {s}.unique_keys AS u (component, unique_key, run_id)
            VALUES ($1, $2, NULL)
            ON CONFLICT (component, unique_key) DO UPDATE SET run_id = u.run_id
            RETURNING u.run_id, {now} AS db_now""",
        unique_set=f"""
            UPDATE {s}.unique_keys SET run_id = $3 WHERE component = $1 AND unique_key = $2""",
        recent_slots=f"""
            SELECT slot_at, run_id FROM {s}.schedule_slots WHERE schedule = $1
            ORDER BY slot_at DESC LIMIT $2""",
        prune_slots=f"""
            WITH d AS (DELETE FROM {s}.schedule_slots WHERE schedule = $1 AND slot_at < $2
                       RETURNING 1)
            SELECT count(*) FROM d""",
    )
