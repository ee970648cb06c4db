"""Schedule state and slot firing on PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence

from runq.ids import new_run_id
from runq.model import NewRun, ScheduleState, SlotFire
from runq.store import codec
from runq.store.postgres.base import PostgresBase


class PostgresSchedules(PostgresBase):
    """A group of ``Store`` verbs; ``PostgresStore`` composes the groups."""

    async def schedule_states(self, names: Sequence[str]) -> tuple[float, list[ScheduleState]]:
        if not names:
            return await self.now(), []
        found = await self._db.fetch(self._schedule_sql.schedule_states, list(names))
        now = found[0]["db_now"] if found else await self.now()
        return now, [codec.schedule_state(r) for r in found]

    async def fire_schedule_slot(
        self, name: str, slot_at: float, new: NewRun, *, skip_if_running: bool
    ) -> SlotFire:
        run_id = new.id or new_run_id()
        values = codec.insert_values(new, run_id, self._sealer, codec.encoded_payload(new))
        row = await self._db.fetchone(
            self._schedule_sql.fire_slot, name, slot_at, skip_if_running, *values
        )
        return SlotFire(recorded=row["recorded"] > 0, run_id=row["run_id"])

    async def advance_schedule_cursor(self, name: str, cursor_at: float) -> None:
        await self._db.fetchval(self._schedule_sql.advance_cursor, name, cursor_at)

    async def set_schedule_paused(self, name: str, paused: bool) -> ScheduleState:
        row = await self._db.fetchone(self._schedule_sql.set_paused, name, paused)
        return codec.schedule_state(row)

    async def recent_schedule_slots(
        self, name: str, *, limit: int
    ) -> list[tuple[float, str | None]]:
        found = await self._db.fetch(self._schedule_sql.recent_slots, name, limit, retry=True)
        return [(r["slot_at"], r["run_id"]) for r in found]

    async def prune_schedule_slots(self, name: str, *, before: float) -> int:
        deleted: int = await self._db.fetchval(self._schedule_sql.prune_slots, name, before)
        return deleted
