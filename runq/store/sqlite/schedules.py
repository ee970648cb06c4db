"""Schedule state and slot firing on SQLite."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from runq.ids import new_run_id
from runq.model import FINAL_STATUSES, NewRun, ScheduleState, SlotFire, Status
from runq.store import codec
from runq.store.sqlite.base import SqliteBase, json_encoder


class SqliteSchedules(SqliteBase):
    """A group of ``Store`` verbs; ``SqliteStore`` composes the groups."""

    async def schedule_states(self, names: Sequence[str]) -> tuple[float, list[ScheduleState]]:
        encoded = json_encoder.encode(list(names)).decode()
        q = self._schedule_sql

        def body(conn: sqlite3.Connection, now: float) -> tuple[float, list[ScheduleState]]:
            conn.execute(q.ensure_schedules, {"names": encoded, "now": now})
            found = conn.execute(q.schedule_states, {"names": encoded}).fetchall()
            return now, [codec.schedule_state(r) for r in found]

        return await self._write(body)

    async def fire_schedule_slot(
        self, name: str, slot_at: float, new: NewRun, *, skip_if_running: bool
    ) -> SlotFire:
        run_id = new.id or new_run_id()
        encoded = codec.encoded_payload(new)
        params: dict[str, Any] = {
            **codec.insert_values(new, run_id, self._sealer, encoded)._asdict(),
            "concurrency_key": new.concurrency_key,
            "timeout_seconds": new.timeout_seconds,
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
            return codec.schedule_state(row)

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
