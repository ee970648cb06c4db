"""Every SQLite statement text, built once per schema by pure functions.

``schema`` is a table prefix (``{schema}_runs``). Timestamps are bound as ``:now``, read
from the database clock once at the start of each transaction. Where a statement names
an index (``INDEXED BY``) or repeats a partial index's predicate term for term, it does so
because SQLite's planner would otherwise pick a worse path or not use the index at all.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from runq.flow import NO_CAP
from runq.model import ACTIVE_STATUSES, FINAL_STATUSES, Status
from runq.seal import SEALED_COLUMNS
from runq.store.statements import (
    fenced,
    order_by,
    reap_exhausted_error,
    sources_of,
    status_list,
    target_of,
)

#: The database clock in epoch seconds, plus the (test-only) offset bound as ``?``.
NOW = "SELECT (julianday('now') - 2440587.5) * 86400.0 + ?"
BEGIN_IMMEDIATE = "BEGIN IMMEDIATE"
BEGIN = "BEGIN"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
PING = "SELECT 1"
_FINAL_IN = f"status IN ({status_list(FINAL_STATUSES)})"  # the final index's predicate
_ACTIVE_IN = f"status IN ({status_list(ACTIVE_STATUSES)})"  # the session index's predicate
_LEASE_CLEAR = "locked_by = NULL, locked_at = NULL"
_FENCE = "id = :id AND attempt = :attempt AND locked_by = :worker AND status = 'running'"


def _fence(verb: str) -> str:
    """The lease fence of a worker's write: it cannot land on a run that was reaped and
    claimed again by someone else meanwhile."""
    fenced(verb)
    return _FENCE


def pragmas(busy_timeout_seconds: float, *, query_only: bool) -> tuple[str, ...]:
    """The settings of every connection, applied once when it opens."""
    settings = (
        f"PRAGMA busy_timeout = {int(busy_timeout_seconds * 1000)}",
        "PRAGMA journal_mode = WAL",  # readers never block the writer, nor it them
        "PRAGMA synchronous = NORMAL",  # durable across process crashes in WAL mode
        "PRAGMA temp_store = MEMORY",
    )
    return (*settings, "PRAGMA query_only = 1") if query_only else settings


@dataclass(frozen=True, slots=True)
class ClaimShape:
    """Which optional rules a claim statement carries; each shape is its own statement so
    the planner sees only the filters in use."""

    deployment: bool
    sessions: bool
    block_users: bool
    block_configurations: bool
    block_pairs: bool
    by_id: bool
    #: ``[limits]`` configured: group each run and take at most each group's room.
    limited: bool = False


@dataclass(frozen=True, slots=True)
class Statements:
    """Every statement text of one schema, built once."""

    get: str
    by_key: str
    count_queued: str
    count_runs: str
    insert: str
    cancel_now: str
    cancel_request: str
    continue_: str
    requeue: str
    claims: Mapping[ClaimShape, str]
    heartbeat: str
    touch_worker: str
    release: str
    complete: str
    fail: str
    pause: str
    settle_cancelled: str
    non_idempotent: str
    add_run_usage: str
    usage_upsert: str
    usage_get: str
    usage_in_period: str
    reap: str
    purge: str
    purge_with_paused: str
    register_worker: str
    remove_worker: str
    prune_workers: str
    list_workers: str
    live_workers: str
    counts: str
    oldest_queued: str
    expired_leases: str
    reseal_select: str
    reseal_update: Mapping[str, str]
    create_migrations_table: str
    migration_applied: str
    record_migration: str
    migrations_table_exists: str
    applied_versions: str
    ids_with_prefix: str
    # -- flow control: limits, rate windows, pauses ------------------------------------
    running_by_component: str
    rate_windows_get: str
    rate_windows_bump: str
    pause_insert: str
    pause_get: str
    pause_delete: str
    pause_list: str
    session_ahead: str
    queued_by_component: str
    # -- submit's depth gates (count stops at the limit) ----------------------------------
    count_due: str
    count_delayed: str
    count_user_queued: str
    # -- the fleet's seal key fingerprint -------------------------------------------------
    seal_check_get: str
    seal_check_put: str
    # -- the event log (kept together at the end) --
    events_fence: str
    events_last_seq: str
    events_insert: str
    events_list: str
    events_trim: str
    events_sealed: str
    events_reseal: str


def _reap(t: str) -> str:
    """The reaper's rules as one statement: the rules are CASE arms in their order (inside a
    non-idempotent section, no saved request, out of attempts), and the WHERE rechecks
    staleness on the row itself, so a lease renewed meanwhile is left alone."""
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
        f"   WHEN {rule3} THEN {reap_exhausted_error()} ELSE error END,"
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


_COMPONENT = "(r.component_type || '/' || r.component_id)"
#: A run's limit group: the first (most specific) of the ``:pats`` it matches. GLOB's ``*``
#: is the pattern's own wildcard and patterns hold no other GLOB character.
_GROUP = (
    "(SELECT CAST(p.key AS INTEGER) FROM json_each(:pats) p"
    f" WHERE {_COMPONENT} GLOB p.value ORDER BY p.key LIMIT 1)"
)


def _room(group: str) -> str:
    return f"json_extract(:rooms, '$[' || {group} || ']')"


#: Runs the run's (group, concurrency key) may still start: ``:kmax`` holds each group's
#: ``max_running_per_key``, ``:krun`` the [group, key, running] of the keys running now.
_KEY_ROOM = (
    f"CASE WHEN r.concurrency_key IS NULL OR {_GROUP} IS NULL THEN {NO_CAP}"
    f" ELSE json_extract(:kmax, '$[' || {_GROUP} || ']') - coalesce(("
    "SELECT json_extract(k.value, '$[2]') FROM json_each(:krun) k"
    f" WHERE json_extract(k.value, '$[0]') = {_GROUP}"
    " AND json_extract(k.value, '$[1]') = r.concurrency_key), 0) END"
)


def _claim(t: str, shape: ClaimShape) -> str:
    pauses = t.removesuffix("_runs") + "_pauses"
    filters = [
        "r.status = 'queued'",
        "r.available_at <= :now",
        # Paused work is skipped by every claim at once; the table is tiny, usually empty.
        f"NOT EXISTS (SELECT 1 FROM {pauses} p"
        " WHERE (p.kind = 'deployment' AND p.target = r.deployment_id)"
        f" OR (p.kind = 'component' AND {_COMPONENT} GLOB p.target))",
    ]
    if shape.limited:
        # A group with no room is filtered inside the walk, so its runs do not fill the
        # LIMIT and the runs behind them go on.
        filters.append(f"coalesce({_room(_GROUP)}, 1) > 0 AND {_KEY_ROOM} > 0")
    if shape.by_id:
        filters.append("r.id = :run_id")
    if shape.sessions:
        # The session rule in one probe of the active-session index: a run waits while
        # another active run of its session is older, or is running or paused.
        filters.append(
            f"(r.session_id IS NULL OR NOT EXISTS (SELECT 1 FROM {t} s"
            f" WHERE s.session_id = r.session_id AND s.{_ACTIVE_IN} AND s.id <> r.id"
            " AND (s.id < r.id OR s.status <> 'queued')))"
        )
    if shape.block_users:
        filters.append("coalesce(r.user_id, '') NOT IN (SELECT value FROM json_each(:bu))")
    if shape.block_configurations:
        filters.append("coalesce(r.configuration, '') NOT IN (SELECT value FROM json_each(:bc))")
    if shape.block_pairs:
        filters.append(
            "NOT EXISTS (SELECT 1 FROM json_each(:bp) p"
            " WHERE json_extract(p.value, '$[0]') = coalesce(r.user_id, '')"
            " AND json_extract(p.value, '$[1]') = coalesce(r.configuration, ''))"
        )
    where = " AND ".join(filters)
    order = "ORDER BY r.priority, r.available_at, r.id LIMIT :slots"
    # Walk the claim index in claim order so LIMIT stops early; one run by id is a
    # primary-key lookup instead.
    walk = "" if shape.by_id else f" INDEXED BY {t}_claim_idx"

    group_column = (
        f", {_GROUP} AS grp, r.concurrency_key AS ckey, {_KEY_ROOM} AS kroom"
        if shape.limited
        else ""
    )

    def branch(dep: str) -> str:
        return (
            f"SELECT r.id, r.priority, r.available_at{group_column} FROM {t} r{walk}"
            f" WHERE r.deployment_id = {dep} AND {where} {order}"
        )

    no_dep = "''"
    if shape.deployment:
        # Two ordered index walks (no deployment, ours) merged, instead of one IN that
        # would sort every claimable row to find the first few.
        candidates = (
            f"SELECT id FROM (SELECT * FROM ({branch(no_dep)})"
            f" UNION ALL SELECT * FROM ({branch(':dep')}))"
            " ORDER BY priority, available_at, id LIMIT :slots"
        )
    else:
        candidates = f"SELECT id FROM ({branch(no_dep)})"
    if shape.limited:
        # At most ``room`` runs per group among the candidates. The claim runs under
        # BEGIN IMMEDIATE, so the room counted before it cannot be spent meanwhile.
        union = candidates.removeprefix("SELECT id FROM ").split(" ORDER BY priority")[0]
        candidates = (
            "SELECT id FROM (SELECT *, row_number() OVER (PARTITION BY grp"
            " ORDER BY priority, available_at, id) AS nth,"
            " row_number() OVER (PARTITION BY grp, ckey"
            f" ORDER BY priority, available_at, id) AS knth FROM {union})"
            f" WHERE (grp IS NULL OR nth <= {_room('grp')})"
            " AND (ckey IS NULL OR knth <= kroom)"
            " ORDER BY priority, available_at, id LIMIT :slots"
        )
    return (
        f"UPDATE {t} SET status = {target_of('claim')}, attempt = attempt + 1,"
        " locked_by = :worker, locked_at = :now, started_at = :now, updated_at = :now"
        # ``+status``: the recheck must not tempt the planner away from the id lookup.
        f" WHERE +status IN ({sources_of('claim')}) AND id IN ({candidates}) RETURNING *"
    )


def _claims(t: str) -> dict[ClaimShape, str]:
    return {
        shape: _claim(t, shape)
        for shape in itertools.starmap(ClaimShape, itertools.product((False, True), repeat=7))
    }


def _fail(t: str) -> str:
    # The retry rule lives in the statement, so it is decided on the row as it is at the
    # moment of the write, not as the worker last saw it.
    retry = ":retryable AND attempt < max_attempts AND non_idempotent = 0"
    return (
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
        f" error = :error, updated_at = :now, {_LEASE_CLEAR}"
        f" WHERE {_fence('fail')} RETURNING status"
    )


def _lifecycle(t: str) -> dict[str, str]:
    return {
        "cancel_now": (
            f"UPDATE {t} SET status = {target_of('cancel')}, termination_reason = 'cancelled',"
            f" cancel_requested = 1, completed_at = :now, updated_at = :now, {_LEASE_CLEAR},"
            " resume_state = NULL, decision = NULL"
            f" WHERE id = :id AND status IN ({sources_of('cancel')}) RETURNING *"
        ),
        "cancel_request": (
            f"UPDATE {t} SET cancel_requested = 1, updated_at = :now"
            f" WHERE id = :id AND status IN ({sources_of('request_cancel')}) RETURNING *"
        ),
        "continue_": (
            f"UPDATE {t} SET status = {target_of('continue')}, decision = :decision,"
            " max_attempts = MAX(max_attempts, attempt + 1), available_at = :now,"
            " continued_at = :now,"
            f" updated_at = :now, {_LEASE_CLEAR}"
            f" WHERE id = :id AND status IN ({sources_of('continue')}) RETURNING *"
        ),
        "requeue": (
            f"UPDATE {t} SET status = {target_of('requeue')}, max_attempts = attempt + 1,"
            " available_at = :now, updated_at = :now, error = NULL, termination_reason = NULL,"
            f" completed_at = NULL, {_LEASE_CLEAR}, non_idempotent = 0,"
            " cancel_requested = CASE WHEN :clear THEN 0 ELSE cancel_requested END"
            f" WHERE id = :id AND status IN ({sources_of('requeue')}) RETURNING *"
        ),
    }


def _worker(t: str, workers: str) -> dict[str, str]:
    return {
        "heartbeat": (
            f"UPDATE {t} SET locked_at = :now"
            " FROM (SELECT json_extract(value, '$[0]') AS lid, json_extract(value, '$[1]') AS la"
            "       FROM json_each(:leases)) AS l"
            f" WHERE {t}.id = l.lid AND {t}.attempt = l.la"
            f" AND {t}.locked_by = :worker AND +{t}.status = 'running'"
            f" RETURNING {t}.id, {t}.attempt, {t}.cancel_requested"
        ),
        "touch_worker": f"UPDATE {workers} SET last_seen_at = ? WHERE id = ?",
        # Undo a claim (fenced on the lease it took): queued again, attempt restored.
        "release": (
            f"UPDATE {t} SET status = 'queued', attempt = attempt - 1,"
            " started_at = CASE WHEN attempt = 1 THEN NULL ELSE started_at END,"
            f" error = coalesce(:error, error), updated_at = :now, {_LEASE_CLEAR}"
            f" WHERE {_FENCE}"
        ),
        "complete": (
            f"UPDATE {t} SET status = {target_of('complete')}, answer = :answer,"
            " termination_reason = :reason, completed_at = :now, updated_at = :now,"
            f" {_LEASE_CLEAR}, resume_state = NULL, decision = NULL, non_idempotent = 0"
            f" WHERE {_fence('complete')} RETURNING id"
        ),
        "fail": _fail(t),
        "pause": (
            f"UPDATE {t} SET status = {target_of('pause')}, pause_reason = :reason,"
            " resume_state = :state,"
            # continued_at marks "this pause was answered"; a new pause is unanswered.
            f" decision = NULL, continued_at = NULL, updated_at = :now, {_LEASE_CLEAR}"
            f" WHERE {_fence('pause')} RETURNING id"
        ),
        "settle_cancelled": (
            f"UPDATE {t} SET status = {target_of('settle_cancelled')},"
            " termination_reason = 'cancelled',"
            f" completed_at = :now, updated_at = :now, {_LEASE_CLEAR},"
            " resume_state = NULL, decision = NULL"
            f" WHERE {_fence('settle_cancelled')} RETURNING id"
        ),
        "non_idempotent": (
            f"UPDATE {t} SET non_idempotent = :inside WHERE {_fence('set_non_idempotent')}"
            " RETURNING id"
        ),
    }


def _usage(t: str, u: str) -> dict[str, str]:
    return {
        "add_run_usage": (
            f"UPDATE {t} SET tokens = tokens + :tokens, cost = cost + :cost WHERE id = :id"
        ),
        "usage_upsert": (
            f"INSERT INTO {u} (scope, subject, period_start, cost, tokens, runs)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (scope, subject, period_start) DO UPDATE SET"
            " cost = cost + excluded.cost, tokens = tokens + excluded.tokens,"
            " runs = runs + excluded.runs"
        ),
        "usage_get": (
            f"SELECT cost, tokens, runs FROM {u}"
            " WHERE scope = ? AND subject = ? AND period_start = ?"
        ),
        "usage_in_period": (
            f"SELECT scope, subject, period_start, cost, tokens, runs FROM {u}"
            " WHERE scope = ? AND period_start = ?"
        ),
    }


def _maintenance(t: str, w: str) -> dict[str, str]:
    final = (
        f"SELECT id FROM {t} INDEXED BY {t}_final_idx"
        f" WHERE {_FINAL_IN} AND completed_at < :cutoff LIMIT :batch"
    )
    paused = (
        f"SELECT id FROM {t} INDEXED BY {t}_paused_idx"
        " WHERE status = 'paused' AND updated_at < :paused_cutoff LIMIT :batch"
    )
    return {
        "purge": f"DELETE FROM {t} WHERE id IN ({final})",
        # Each kind walks its own partial index; the batch limit covers both.
        "purge_with_paused": (
            f"DELETE FROM {t} WHERE id IN (SELECT id FROM"
            f" (SELECT * FROM ({final}) UNION ALL SELECT * FROM ({paused})) LIMIT :batch)"
        ),
        "register_worker": (
            f"INSERT INTO {w} (id, hostname, pid, deployment_id, started_at, last_seen_at)"
            " VALUES (:id, :hostname, :pid, :deployment_id, :now, :now)"
            " ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname, pid = excluded.pid,"
            " deployment_id = excluded.deployment_id, last_seen_at = excluded.last_seen_at"
        ),
        "remove_worker": f"DELETE FROM {w} WHERE id = ?",
        "prune_workers": f"DELETE FROM {w} WHERE last_seen_at < ?",
        "list_workers": f"SELECT * FROM {w} WHERE last_seen_at >= ? ORDER BY started_at, id",
        "live_workers": f"SELECT count(*) FROM {w} WHERE last_seen_at >= ?",
        "counts": f"SELECT status, count(*) FROM {t} GROUP BY status",
        # Oldest claimable-since time per deployment; a delayed run is not waiting yet.
        "oldest_queued": (
            f"SELECT deployment_id, min(available_at) FROM {t}"
            f" INDEXED BY {t}_claim_idx"  # covering: no table lookups
            " WHERE status = 'queued' AND available_at <= ? GROUP BY deployment_id"
        ),
        "expired_leases": (
            f"SELECT count(*) FROM {t} INDEXED BY {t}_lease_idx"
            " WHERE status = 'running' AND locked_at < ?"
        ),
        "reseal_select": (
            f"SELECT id, {', '.join(SEALED_COLUMNS)} FROM {t} WHERE id > ? ORDER BY id LIMIT ?"
        ),
    }


def _reseal_updates(t: str) -> dict[str, str]:
    # Compare-and-set on the old value: a column rewritten meanwhile (an answer stored by a
    # completion) is already under the new key and is left alone.
    return {c: f"UPDATE {t} SET {c} = ? WHERE id = ? AND {c} = ?" for c in SEALED_COLUMNS}


def _migrations(m: str) -> dict[str, str]:
    return {
        "create_migrations_table": (
            f"CREATE TABLE IF NOT EXISTS {m}"
            " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        ),
        "migration_applied": f"SELECT 1 FROM {m} WHERE version = ?",
        "record_migration": f"INSERT INTO {m} (version, name, applied_at) VALUES (?, ?, ?)",
        "migrations_table_exists": (
            f"SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{m}'"
        ),
        "applied_versions": f"SELECT version FROM {m}",
    }


def _events(t: str, e: str) -> dict[str, str]:
    """The event log. Lifecycle events are written by the triggers of migration 0005; a
    handler's batch checks its fence and numbers its rows after the last stored one, all in
    one write transaction (SQLite has one writer at a time, so nobody numbers in between)."""
    return {
        "events_fence": f"SELECT 1 FROM {t} WHERE {_fence('append_events')}",
        "events_last_seq": f"SELECT coalesce(max(seq), 0) FROM {e} WHERE run_id = ?",
        "events_insert": (
            f"INSERT INTO {e} (run_id, seq, attempt, at, kind, data) VALUES (?, ?, ?, ?, ?, ?)"
        ),
        "events_list": (
            f"SELECT seq, attempt, at, kind, info, data FROM {e}"
            " WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        ),
        # The second parameter: drop lifecycle details too (level none).
        "events_trim": (
            f"UPDATE {e} SET data = NULL, info = CASE WHEN :all THEN NULL ELSE info END"
            " WHERE run_id = :id AND (data IS NOT NULL OR (:all AND info IS NOT NULL))"
        ),
        "events_sealed": (
            f"SELECT seq, data FROM {e} WHERE run_id = ? AND data IS NOT NULL ORDER BY seq"
        ),
        "events_reseal": f"UPDATE {e} SET data = ? WHERE run_id = ? AND seq = ?",
    }


def build(schema: str) -> Statements:
    """Every statement of one schema (``schema`` already checked to be an identifier)."""
    t, w = f"{schema}_runs", f"{schema}_workers"
    return Statements(
        get=f"SELECT * FROM {t} WHERE id = ?",
        by_key=f"SELECT * FROM {t} WHERE idempotency_key = ? AND coalesce(user_id, '') = ?",
        # Bounded: counting stops at the depth limit instead of scanning a huge backlog.
        count_queued=f"SELECT count(*) FROM (SELECT 1 FROM {t} WHERE status = 'queued' LIMIT ?)",
        count_runs=f"SELECT count(*) FROM {t}",
        insert=(
            f"INSERT INTO {t} (id, component_type, component_id, status, attempt, max_attempts,"
            " priority, session_id, user_id, actor, configuration, deployment_id,"
            " idempotency_key, origin, created_at, updated_at, available_at, has_request,"
            " payload, concurrency_key) VALUES (:id, :component_type, :component_id, 'queued',"
            " 0, :max_attempts, :priority, :session_id, :user_id, :actor, :configuration,"
            " :deployment_id, :idempotency_key, :origin, :now, :now, :now + :delay,"
            " :has_request, :payload, :concurrency_key)"
        ),
        claims=_claims(t),
        reap=_reap(t),
        reseal_update=_reseal_updates(t),
        **_lifecycle(t),
        **_worker(t, w),
        **_usage(t, f"{schema}_budget_usage"),
        **_maintenance(t, w),
        **_migrations(f"{schema}_schema_migrations"),
        # The range walks the primary key from the prefix on; substr keeps it exact.
        ids_with_prefix=(
            f"SELECT id FROM {t} WHERE id >= :prefix AND id < :upper"
            " AND substr(id, 1, length(:prefix)) = :prefix ORDER BY id LIMIT :limit"
        ),
        **_flow(t, f"{schema}_rate_windows", f"{schema}_pauses"),
        **_depth_gates(t),
        seal_check_get=f"SELECT key_id FROM {schema}_seal_check WHERE id = 1",
        seal_check_put=(
            f"INSERT INTO {schema}_seal_check (id, key_id, updated_at) VALUES (1, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET key_id = excluded.key_id,"
            " updated_at = excluded.updated_at"
        ),
        **_events(t, f"{schema}_run_events"),
    )


def _depth_gates(t: str) -> dict[str, str]:
    """Bounded counts for submit's gates: due runs (the global depth), delayed runs (their own
    bound, so far-future runs cannot fill the queue), and one user's queued runs."""
    queued = f"SELECT 1 FROM {t} WHERE status = 'queued'"
    return {
        "count_due": f"SELECT count(*) FROM ({queued} AND available_at <= ? LIMIT ?)",
        "count_delayed": f"SELECT count(*) FROM ({queued} AND available_at > ? LIMIT ?)",
        "count_user_queued": (
            f"SELECT count(*) FROM (SELECT 1 FROM {t} WHERE user_id = ? AND status = 'queued'"
            " LIMIT ?)"
        ),
    }


def _flow(t: str, rates: str, pauses: str) -> dict[str, str]:
    return {
        "running_by_component": (
            f"SELECT {_COMPONENT} AS component, r.concurrency_key, count(*) AS n"
            f" FROM {t} r WHERE r.status = 'running' GROUP BY 1, 2"
        ),
        "rate_windows_get": (
            f"SELECT pattern, window_start, used FROM {rates}"
            " WHERE pattern IN (SELECT value FROM json_each(?))"
        ),
        # A new window starts over.
        "rate_windows_bump": (
            f"INSERT INTO {rates} (pattern, window_start, used) VALUES (?, ?, ?)"
            " ON CONFLICT (pattern) DO UPDATE SET"
            f" used = CASE WHEN {rates}.window_start = excluded.window_start"
            f" THEN {rates}.used + excluded.used ELSE excluded.used END,"
            " window_start = excluded.window_start"
        ),
        "pause_insert": (
            f"INSERT INTO {pauses} (id, kind, target, like_pattern, reason, created_by,"
            " created_at) VALUES (?, ?, ?, NULL, ?, ?, ?)"
            " ON CONFLICT (kind, target) DO NOTHING"
        ),
        "pause_get": f"SELECT * FROM {pauses} WHERE kind = ? AND target = ?",
        "pause_delete": f"DELETE FROM {pauses} WHERE id = ? OR (kind = ? AND target = ?)"
        " RETURNING *",
        "pause_list": f"SELECT * FROM {pauses} ORDER BY created_at, id",
        # The session rule for one run (:id, :session), as the claim applies it.
        "session_ahead": (
            f"SELECT EXISTS (SELECT 1 FROM {t} s WHERE s.session_id = :session"
            f" AND s.{_ACTIVE_IN} AND s.id <> :id AND (s.id < :id OR s.status <> 'queued'))"
        ),
        "queued_by_component": (
            f"SELECT {_COMPONENT} AS component, r.deployment_id,"
            " sum(r.available_at <= :now) AS ready, sum(r.available_at > :now) AS delayed"
            f" FROM {t} r WHERE r.status = 'queued' GROUP BY 1, 2"
        ),
    }


def list_jobs(
    schema: str, *, statuses: Sequence[Status], by_user: bool, sort_by: str, sort_order: str
) -> tuple[str, str]:
    """(page, count) of the operator listing. Parameters: one per status, then the user id
    when ``by_user``; the page adds LIMIT and OFFSET. Only whitelisted identifiers are
    interpolated."""
    filters: list[str] = []
    if statuses:
        filters.append(f"status IN ({', '.join('?' for _ in statuses)})")
    if by_user:
        filters.append("user_id = ?")
    where = f" WHERE {' AND '.join(filters)}" if filters else ""
    t = f"{schema}_runs"
    page = f"SELECT * FROM {t}{where} ORDER BY {order_by(sort_by, sort_order)} LIMIT ? OFFSET ?"
    return page, f"SELECT count(*) FROM {t}{where}"


# -- schedules and unique runs -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleStatements:
    """Statements of schedules and unique runs, kept apart from the run-table verbs. Each
    runs inside the writer's ``BEGIN IMMEDIATE`` transaction, which already serializes
    every replica on the file."""

    ensure_schedules: str
    schedule_states: str
    last_run_status: str
    record_slot: str
    note_fire: str
    advance_cursor: str
    set_paused: str
    unique_get: str
    unique_set: str
    recent_slots: str
    prune_slots: str


def build_schedules(schema: str) -> ScheduleStatements:
    sc, slots, t = f"{schema}_schedules", f"{schema}_schedule_slots", f"{schema}_runs"
    u = f"{schema}_unique_keys"
    return ScheduleStatements(
        # A schedule seen for the first time starts counting its slots from now.
        ensure_schedules=(
            f"INSERT INTO {sc} (name, cursor_at, updated_at)"
            " SELECT value, :now, :now FROM json_each(:names) WHERE true"
            " ON CONFLICT (name) DO NOTHING"
        ),
        schedule_states=f"SELECT * FROM {sc} WHERE name IN (SELECT value FROM json_each(:names))",
        last_run_status=(
            f"SELECT r.status FROM {sc} s JOIN {t} r ON r.id = s.last_run_id WHERE s.name = :name"
        ),
        # The primary key makes a slot fire once; a second insert changes nothing.
        record_slot=(
            f"INSERT INTO {slots} (schedule, slot_at, run_id, fired_at)"
            " SELECT :name, :slot, :run_id, :now"
            f" WHERE EXISTS (SELECT 1 FROM {sc} WHERE name = :name)"
            " ON CONFLICT (schedule, slot_at) DO NOTHING"
        ),
        note_fire=(
            f"UPDATE {sc} SET"
            " last_run_id = CASE WHEN :run_id IS NOT NULL"
            "   AND :slot >= coalesce(last_slot_at, :slot) THEN :run_id ELSE last_run_id END,"
            " last_slot_at = max(coalesce(last_slot_at, :slot), :slot),"
            " last_fire_at = :now, cursor_at = max(cursor_at, :slot), updated_at = :now"
            " WHERE name = :name"
        ),
        advance_cursor=(
            f"UPDATE {sc} SET cursor_at = :cursor, updated_at = :now"
            " WHERE name = :name AND cursor_at < :cursor"
        ),
        # Resuming moves the cursor to now: slots that fell inside the pause do not fire.
        set_paused=(
            f"INSERT INTO {sc} (name, paused, paused_at, cursor_at, updated_at)"
            " VALUES (:name, :paused, CASE WHEN :paused THEN :now END, :now, :now)"
            " ON CONFLICT (name) DO UPDATE SET paused = :paused,"
            f" paused_at = CASE WHEN :paused THEN coalesce({sc}.paused_at, :now) END,"
            f" cursor_at = CASE WHEN :paused THEN {sc}.cursor_at"
            f"   ELSE max({sc}.cursor_at, :now) END,"
            " updated_at = :now RETURNING *"
        ),
        unique_get=(
            f"SELECT r.* FROM {u} k JOIN {t} r ON r.id = k.run_id"
            " WHERE k.component = :component AND k.unique_key = :key"
        ),
        unique_set=(
            f"INSERT INTO {u} (component, unique_key, run_id) VALUES (:component, :key, :run_id)"
            " ON CONFLICT (component, unique_key) DO UPDATE SET run_id = excluded.run_id"
        ),
        recent_slots=(
            f"SELECT slot_at, run_id FROM {slots} WHERE schedule = :name"
            " ORDER BY slot_at DESC LIMIT :limit"
        ),
        prune_slots=f"DELETE FROM {slots} WHERE schedule = :name AND slot_at < :before",
    )
