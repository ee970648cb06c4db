"""Schedule and unique-run statements, built once per schema beside ``Statements``."""

from __future__ import annotations

from dataclasses import dataclass

from runq.store.postgres.statements.fragments import ACTIVE_LIST, clock_expr
from runq.store.postgres.statements.runs import INSERT_COLUMNS


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
    "skip"), then the run's columns as in ``submit_sql`` from $4 (id) to $18 (payload).
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
                WHERE r.id = (SELECT last_run_id FROM st) AND r.status IN ({ACTIVE_LIST})
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
            INSERT INTO {s}.runs ({INSERT_COLUMNS})
            SELECT $4, $5, $6, 'queued', 0, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                   {now}, {now}, {now} + $16::float8, $17, $18, NULL::text, NULL::float8
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
    s, now = schema, clock_expr(offset)
    return ScheduleStatements(
        # A schedule seen for the first time starts counting its slots from now, so a new
        # schedule never fires for the past. $1 names, inserted in name order (two replicas
        # starting together wait for each other's new rows in one order).
        schedule_states=f"""
            WITH ins AS (
                INSERT INTO {s}.schedules (name, cursor_at, updated_at)
                SELECT n, {now}, {now} FROM unnest($1::text[]) AS n ORDER BY n
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
        # Rows another replica's prune holds are left to it (SKIP LOCKED): two prunes of
        # one schedule never wait for each other.
        prune_slots=f"""
            WITH gone AS MATERIALIZED (
                SELECT slot_at FROM {s}.schedule_slots WHERE schedule = $1 AND slot_at < $2
                ORDER BY slot_at FOR UPDATE SKIP LOCKED
            ), d AS (
                DELETE FROM {s}.schedule_slots
                WHERE schedule = $1 AND slot_at = ANY(ARRAY(SELECT slot_at FROM gone))
                RETURNING 1
            )
            SELECT count(*) FROM d""",
    )
