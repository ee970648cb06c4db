"""Every PostgreSQL statement text, built once per (schema, clock offset) by pure functions.

Texts never carry user input (only the schema, checked to be an identifier, enum values and
integers), so asyncpg's per-connection statement cache keeps them prepared. Every time
written comes from the database clock: ``now()`` of the statement's transaction plus the
clock offset, which only tests set.

Plans: each statement keeps one generic plan per connection, made at its first execution,
possibly on an empty table. Each is shaped so that its only sensible plan is its index
path at any table size (rows named by id reach them by primary key: ``unindexed`` status
tests; several rows are locked through ``locked_in_id_order``; with the session's
``enable_seqscan = off``), which tests/store/test_pg_plans.py measures on a table grown
from empty to 100,000 runs (docs/INTERNALS.md, "Plans").
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from runq.store.postgres.statements.claims import (
    admit_sql,
    claim_head_sql,
    claim_sql,
    limited_claim_sql,
    release_sql,
)
from runq.store.postgres.statements.events import events_sql
from runq.store.postgres.statements.fragments import clock_expr
from runq.store.postgres.statements.lifecycle import lifecycle_sql
from runq.store.postgres.statements.limits import limits_sql, usage_sql
from runq.store.postgres.statements.operations import (
    LISTING,
    maintenance_sql,
    reap_sql,
    reseal_select,
    worker_sql,
)
from runq.store.postgres.statements.runs import (
    SUBMIT_COPY_COLUMNS,
    batch_sql,
    submit_sql,
)
from runq.store.postgres.statements.schedules import ScheduleStatements, build_schedules

__all__ = [
    "LISTING",
    "SUBMIT_COPY_COLUMNS",
    "ScheduleStatements",
    "Statements",
    "build",
    "build_schedules",
    "names_of",
    "reseal_select",
]


@dataclass(frozen=True, slots=True)
class Statements:
    """Every statement text of one (schema, clock offset), built once."""

    now: str
    get: str
    error_detail: str
    count_runs: str
    submit: str
    batch_keys: str
    batch_count_due: str
    batch_count_delayed: str
    batch_count_user: str
    get_many: str
    cancel: str
    continue_: str
    requeue: str
    claim: str
    claim_affinity: str
    claim_one: str
    claim_head: str
    claim_from_head: str
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
    analyze_tables: str
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
    # -- limits: rate windows, pauses ------------------------------------
    claim_limited: str
    claim_limited_affinity: str
    claim_limited_one: str
    admit: str
    admit_affinity: str
    admit_one: str
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
    events_complete_many: str
    events_complete_one: str
    events_wipe_many: str
    events_sealed_many: str
    events_rotation_select: str
    events_rotation_update: str


def names_of(statements: Statements | ScheduleStatements) -> dict[str, str]:
    """Each statement text of ``statements`` → its field name (the ``verb`` of a metric)."""
    return {getattr(statements, f.name): f.name for f in fields(statements)}


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
        # Every table of the schema, whichever migration made it (the schema name is a
        # checked identifier, so it may be spelled into the block).
        "analyze_tables": f"""
            DO $analyze$
            DECLARE t regclass;
            BEGIN
                FOR t IN SELECT c.oid::regclass FROM pg_class c
                         JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE n.nspname = '{s}' AND c.relkind = 'r' ORDER BY c.relname
                LOOP
                    EXECUTE format('ANALYZE %s', t);
                END LOOP;
            END
            $analyze$""",
    }


def build(schema: str, offset: float) -> Statements:
    """Every statement of one schema at one clock offset."""
    s, now = schema, clock_expr(offset)
    claim, claim_affinity, claim_one = claim_sql(s, now)
    claim_head, claim_from_head = claim_head_sql(s, now)
    limited, limited_affinity, limited_one = limited_claim_sql(s, now)
    admit, admit_affinity, admit_one = admit_sql(s, now)
    return Statements(
        now=f"SELECT {now}",
        get=f"SELECT * FROM {s}.runs WHERE id = $1",
        error_detail=f"SELECT error_detail FROM {s}.runs WHERE id = $1",
        count_runs=f"SELECT count(*) FROM {s}.runs",
        release=release_sql(s, now),
        submit=submit_sql(s, now),
        **batch_sql(s, now),
        claim=claim,
        claim_affinity=claim_affinity,
        claim_one=claim_one,
        claim_head=claim_head,
        claim_from_head=claim_from_head,
        reap=reap_sql(s, now),
        notify="SELECT pg_notify($1, $2)",
        **lifecycle_sql(s, now),
        **worker_sql(s, now),
        **usage_sql(s),
        **maintenance_sql(s, now),
        **_migration_sql(s, now),
        # starts_with is exact under any collation (a range on a non-C collation is not);
        # an operator's one-off lookup can afford the scan.
        ids_with_prefix=f"SELECT id FROM {s}.runs WHERE starts_with(id, $1) ORDER BY id LIMIT $2",
        claim_limited=limited,
        claim_limited_affinity=limited_affinity,
        claim_limited_one=limited_one,
        admit=admit,
        admit_affinity=admit_affinity,
        admit_one=admit_one,
        **limits_sql(s, now),
        seal_check_get=f"SELECT key_id FROM {s}.seal_check WHERE id = 1 FOR UPDATE",
        seal_check_put=(
            f"INSERT INTO {s}.seal_check (id, key_id, updated_at) VALUES (1, $1, {now})"
            " ON CONFLICT (id) DO UPDATE SET key_id = excluded.key_id,"
            " updated_at = excluded.updated_at"
        ),
        **events_sql(s, now),
    )
