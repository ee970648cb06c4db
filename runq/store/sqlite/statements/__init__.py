"""Every SQLite statement text, built once per schema by pure functions.

``schema`` is a table prefix (``{schema}_runs``). Timestamps are bound as ``:now``, read
from the database clock once at the start of each transaction. Where a statement names
an index (``INDEXED BY``) or repeats a partial index's predicate term for term, it does so
because SQLite's planner would otherwise pick a worse path or not use the index at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runq.store.sqlite.statements.claims import ClaimShape, claims_sql
from runq.store.sqlite.statements.events import events_sql
from runq.store.sqlite.statements.fragments import (
    BEGIN,
    BEGIN_IMMEDIATE,
    COMMIT,
    NOW,
    PING,
    ROLLBACK,
    pragmas,
)
from runq.store.sqlite.statements.lifecycle import lifecycle_sql
from runq.store.sqlite.statements.limits import depth_gates_sql, limits_sql, usage_sql
from runq.store.sqlite.statements.operations import (
    LISTING,
    maintenance_sql,
    reap_sql,
    reseal_updates_sql,
    worker_sql,
)
from runq.store.sqlite.statements.schedules import ScheduleStatements, build_schedules

__all__ = [
    "BEGIN",
    "BEGIN_IMMEDIATE",
    "COMMIT",
    "LISTING",
    "NOW",
    "PING",
    "ROLLBACK",
    "ClaimShape",
    "ScheduleStatements",
    "Statements",
    "build",
    "build_schedules",
    "pragmas",
]


@dataclass(frozen=True, slots=True)
class Statements:
    """Every statement text of one schema, built once."""

    get: str
    error_detail: str
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
    # -- limits: rate windows, pauses ------------------------------------
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
    events_rotation_select: str
    events_rotation_update: str


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


def build(schema: str) -> Statements:
    """Every statement of one schema (``schema`` already checked to be an identifier)."""
    t, w = f"{schema}_runs", f"{schema}_workers"
    return Statements(
        get=f"SELECT * FROM {t} WHERE id = ?",
        error_detail=f"SELECT error_detail FROM {t} WHERE id = ?",
        by_key=f"SELECT * FROM {t} WHERE idempotency_key = ? AND coalesce(user_id, '') = ?",
        # Bounded: counting stops at the depth limit instead of scanning a huge backlog.
        count_queued=f"SELECT count(*) FROM (SELECT 1 FROM {t} WHERE status = 'queued' LIMIT ?)",
        count_runs=f"SELECT count(*) FROM {t}",
        insert=(
            f"INSERT INTO {t} (id, component_type, component_id, status, attempt, max_attempts,"
            " priority, session_id, user_id, actor, configuration, deployment_id,"
            " idempotency_key, origin, created_at, updated_at, available_at, has_request,"
            " payload, concurrency_key, timeout_seconds) VALUES (:id, :component_type,"
            " :component_id, 'queued',"
            " 0, :max_attempts, :priority, :session_id, :user_id, :actor, :configuration,"
            " :deployment_id, :idempotency_key, :origin, :now, :now, :now + :delay,"
            " :has_request, :payload, :concurrency_key, :timeout_seconds)"
        ),
        claims=claims_sql(t),
        reap=reap_sql(t),
        reseal_update=reseal_updates_sql(t),
        **lifecycle_sql(t),
        **worker_sql(t, w),
        **usage_sql(t, f"{schema}_budget_usage"),
        **maintenance_sql(t, w),
        **_migrations(f"{schema}_schema_migrations"),
        # The range walks the primary key from the prefix on; substr keeps it exact.
        ids_with_prefix=(
            f"SELECT id FROM {t} WHERE id >= :prefix AND id < :upper"
            " AND substr(id, 1, length(:prefix)) = :prefix ORDER BY id LIMIT :limit"
        ),
        **limits_sql(t, f"{schema}_rate_windows", f"{schema}_pauses"),
        **depth_gates_sql(t),
        seal_check_get=f"SELECT key_id FROM {schema}_seal_check WHERE id = 1",
        seal_check_put=(
            f"INSERT INTO {schema}_seal_check (id, key_id, updated_at) VALUES (1, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET key_id = excluded.key_id,"
            " updated_at = excluded.updated_at"
        ),
        **events_sql(t, f"{schema}_run_events"),
    )
