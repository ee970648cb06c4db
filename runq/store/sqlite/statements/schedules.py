"""Schedule and unique-run statements, built once per schema beside ``Statements``."""

from __future__ import annotations

from dataclasses import dataclass


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
