"""``Operations``: the operator's side of one store, what the HTTP API, the console and
the CLI call to look at the queue and to steer it without submitting work.

Reads: runs and pages of them, a run's view with its reason for waiting and its sealed
error text, events, counts, health, workers, the console's grouped reads, the limits
page's sums and the schedules. Verbs: pauses and schedule pauses (fleet-wide switches,
not runs). Submitting, cancelling, continuing and requeueing runs is the producer side
(``runq.queue.Queue``), which wakes the claimers after its writes.
"""

from __future__ import annotations

from typing import Unpack

from runq.config import Config
from runq.errors import NotFound
from runq.limits.budget import BudgetGate
from runq.limits.waits import WaitInputs, explain
from runq.listing import JobListing, Page, RunCursor, RunFilter, RunList
from runq.log import get_logger
from runq.model import (
    Pause,
    QueueHealth,
    Run,
    RunEvent,
    SettingDivergence,
    Stats,
    Status,
    WaitReason,
    WorkerInfo,
)
from runq.ops.fleet import fleet_divergences
from runq.ops.limits_use import GroupUse, PauseUse, limits_use
from runq.ops.run_ids import resolve_run_id
from runq.ops.schedules import ScheduleView, schedule_view
from runq.ops.views import OPERATOR_VIEW, RunView
from runq.store.base import Store
from runq.store.notifications import Notifications
from runq.store.replication import ReplicationReport

log = get_logger(__name__)


class Operations:
    """The read side and the fleet-wide switches over ``store`` under ``config``."""

    def __init__(self, store: Store, config: Config) -> None:
        self._store = store
        self.config = config

    # -- runs ----------------------------------------------------------------------------

    async def get(self, run_id: str) -> Run | None:
        return await self._store.get(run_id)

    async def resolve_run_id(self, text: str) -> str:
        """A whole run id, or the one run id a prefix starts (``NotFound``,
        ``AmbiguousRunId``)."""
        return await resolve_run_id(self._store, text)

    async def job(self, run: Run) -> RunView:
        """The operator's view of one run: every field, a queued run's reason for waiting
        and the handler's whole error text (opened from its sealed column)."""
        return RunView.of(
            run,
            OPERATOR_VIEW,
            waiting=await self.why_waiting(run),
            error_detail=await self.error_detail(run.id),
        )

    async def error_detail(self, run_id: str) -> str | None:
        """The run's full error text, opened from its sealed column: admins only."""
        return await self._store.error_detail(run_id)

    async def list_jobs(self, **listing: Unpack[JobListing]) -> Page:
        """One page of runs by ``where``, numbered or (``after``) by keyset."""
        return await self._store.list_jobs(**listing)

    async def list_runs(self, where: RunFilter, *, after: RunCursor | None, limit: int) -> RunList:
        """Runs by ``where``, newest first, by keyset (``GET /runs``)."""
        return await self._store.list_runs(where, after=after, limit=limit)

    async def list_events(self, run_id: str, *, after: int, limit: int) -> list[RunEvent]:
        return await self._store.list_events(run_id, after=after, limit=limit)

    async def why_waiting(self, run: Run) -> WaitReason | None:
        """A queued run's reason for waiting (None when nothing holds it back)."""
        if run.status is not Status.QUEUED:
            return None
        store, queue = self._store, self.config.queue
        served = True
        if run.deployment_id:
            workers = await store.list_workers(max_age_seconds=queue.live_worker_seconds)
            served = any(w.deployment_id == run.deployment_id for w in workers)
        inputs = WaitInputs(
            state=await store.limits_state(),
            pauses=await store.list_pauses(),
            session_ahead=bool(run.session_id)
            and queue.serialize_sessions
            and await store.session_ahead(run.id, run.session_id or ""),
            deployment_served=served,
            budget=await BudgetGate(self.config.budget, store).hold(run.user_id, run.configuration),
        )
        return explain(run, store.limits, inputs)

    # -- the queue as a whole ---------------------------------------------------------------

    async def stats(self) -> Stats:
        """Counts by status, the oldest queued age, the pauses and the fleet's divergences."""
        stats = await self._store.stats()
        stats.pauses = await self._store.list_pauses()
        stats.fleet_divergences = await self.divergences()
        return stats

    async def health(
        self, *, lock_grace_seconds: float, worker_max_age_seconds: float
    ) -> QueueHealth:
        return await self._store.health(
            lock_grace_seconds=lock_grace_seconds, worker_max_age_seconds=worker_max_age_seconds
        )

    async def replication(self) -> ReplicationReport:
        """What an acknowledged write survives now: the database's replication mode."""
        return await self._store.replication()

    async def workers(self, *, max_age_seconds: float) -> list[WorkerInfo]:
        return await self._store.list_workers(max_age_seconds=max_age_seconds)

    async def divergences(self, max_age_seconds: float | None = None) -> list[SettingDivergence]:
        """The fleet-wide settings live workers disagree on (live: seen within
        ``max_age_seconds``, by default ``[queue] live_worker_seconds``)."""
        age = self.config.queue.live_worker_seconds if max_age_seconds is None else max_age_seconds
        return fleet_divergences(await self.workers(max_age_seconds=age))

    async def running_by_worker(self) -> dict[str, int]:
        return await self._store.running_by_worker()

    async def finished_per_minute(
        self, *, window_seconds: float
    ) -> tuple[float, list[tuple[float, str, int]]]:
        """(the database clock, (minute start, status, count) rows) over the window."""
        return await self._store.finished_per_minute(window_seconds=window_seconds)

    def notifications(self) -> Notifications:
        """What this process hears of changes (the console's live hints)."""
        return self._store.notifications()

    async def now(self) -> float:
        """The database clock."""
        return await self._store.now()

    async def limits_use(self) -> tuple[list[GroupUse], list[PauseUse]]:
        """Each ``[limits]`` group's use and the runs it holds back, and each pause's."""
        store = self._store
        pauses = await store.list_pauses()
        state = await store.limits_state()
        return limits_use(store.limits, state, pauses, await store.queued_by_component())

    # -- pauses ------------------------------------------------------------------------------

    async def list_pauses(self) -> list[Pause]:
        return await self._store.list_pauses()

    async def add_pause(
        self, kind: str, target: str, *, reason: str | None, created_by: str | None
    ) -> tuple[Pause, bool]:
        """Pause a component pattern or a deployment fleet-wide; ``(pause, created)``."""
        return await self._store.add_pause(kind, target, reason=reason, created_by=created_by)

    async def remove_pause(self, key: str, *, kind: str = "", target: str = "") -> Pause | None:
        """Remove a pause by id (or by ``kind`` and ``target``); None when there is none."""
        return await self._store.remove_pause(key, kind=kind, target=target)

    # -- schedules ---------------------------------------------------------------------------

    async def schedules(self) -> list[ScheduleView]:
        """Every configured schedule with its fleet-wide state, in configuration order."""
        schedules = self.config.schedules
        if not schedules:
            return []
        now, states = await self._store.schedule_states([s.name for s in schedules])
        by_name = {state.name: state for state in states}
        return [schedule_view(s, by_name[s.name], now) for s in schedules if s.name in by_name]

    async def set_schedule_paused(self, name: str, *, paused: bool) -> ScheduleView:
        """Pause or resume a configured schedule for the whole fleet; ``NotFound`` otherwise."""
        schedule = next((s for s in self.config.schedules if s.name == name), None)
        if schedule is None:
            raise NotFound(f"no schedule named {name[:100]!r} in this configuration")
        state = await self._store.set_schedule_paused(name, paused)
        log.info("schedule.paused" if paused else "schedule.resumed", schedule=name)
        return schedule_view(schedule, state, await self._store.now())
