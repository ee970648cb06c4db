"""Claimers fill free slots; the sweep is a bounded claimer for ``runq work``.

``Claimer.run`` claims as many runs as there are free slots (``max_concurrency`` minus
in-flight) in one statement, starts each in the executions task group, and then sleeps
until woken (a transport, a finished run, a requeue) or ``poll_interval`` passes.

When handlers finish faster than a claim takes, slots would sit empty for a claim's round
trip after every batch. So the claimer also claims *ahead*: as many runs as are expected
to free up while one claim is in flight (``max_concurrency`` times claim time over handler time,
both moving averages, at most ``max_concurrency``). Those runs wait in flight (their
leases renewed) and take the next free slots, oldest claim first; one that waits longer
than ``AHEAD_MAX_WAIT_SECONDS`` is given back (queued, attempt not spent), so a replica
whose handlers turned slow does not sit on runs another could start. Slow handlers claim
nothing ahead. ``[queue] claim_ahead = false`` turns it off. The
budget is asked before the claim (a refusal after it would cost the run): users and
configurations over a cap are excluded, so their runs stay queued while the runs behind
them go on. On a database error it logs, backs off with jitter and tries again, so a
PostgreSQL restart needs no restart of the daemon.

``sweep`` is one bounded pass for cron (``runq work``): oldest first, at most
``limit`` runs within ``time_limit`` seconds, executed one at a time by the same executor.
A failed run is that run's outcome; a queue that cannot be read raises.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup, TaskStatus

from runq.config import Config
from runq.log import get_logger
from runq.loops import CLAIM_BACKOFF, Retry, run_periodically
from runq.metrics import (
    CLAIM_PASSES,
    CLAIMS,
    CONCURRENCY_LIMIT,
    IN_FLIGHT,
    STORE_ERRORS,
    UNOPENABLE_RUNS,
)
from runq.model import BudgetBlock, ClaimedRuns, Run
from runq.store.base import Store
from runq.worker.executor import Execution, Executor
from runq.worker.inflight import InFlight, moving_average
from runq.worker.runtime import WorkerRuntime

log = get_logger(__name__)

#: Tuning, not configuration: how long a run claimed ahead waits for a slot before it is
#: given back, and the weight of the newest claim in the claim-time average.
AHEAD_MAX_WAIT_SECONDS = 1.0
CLAIM_SECONDS_WEIGHT = 0.1
#: Claims in flight at once while claiming ahead: a second claim's round trip overlaps the
#: first's, so slots are never idle for a whole one (a claim connection each).
CLAIM_LOOPS = 2


@dataclass(frozen=True)
class ClaimerConfig:
    #: Slots: runs this process executes at once (``[queue] max_concurrency``).
    max_concurrency: int
    #: Seconds between claim passes when nothing wakes the claimer (``[queue] poll_interval``).
    poll_interval: float
    #: This replica's deployment (affinity); None claims only runs with none.
    deployment_id: str | None
    #: One run at a time per session, oldest first (``[queue] serialize_sessions``).
    serialize_sessions: bool
    #: Claim runs ahead of free slots when handlers are faster than claims
    #: (``[queue] claim_ahead``).
    claim_ahead: bool = True

    @classmethod
    def from_config(cls, config: Config) -> ClaimerConfig:
        q = config.queue
        return cls(
            max_concurrency=q.max_concurrency,
            poll_interval=q.poll_interval,
            deployment_id=q.deployment,
            serialize_sessions=q.serialize_sessions,
            claim_ahead=q.claim_ahead,
        )


class Claimer:
    def __init__(
        self,
        store: Store,
        runtime: WorkerRuntime,
        config: ClaimerConfig,
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.config = config
        #: One wake-up event per claim loop (``run`` may run two).
        self._wakes: list[anyio.Event] = [anyio.Event()]
        self._stopping = False
        self._stopped = anyio.Event()
        self.passes = 0
        #: One plain asyncio task per run (an anyio task and cancel scope per run were a
        #: quarter of the worker's CPU); ``_hold_runs`` ties them to the executions group.
        self._tasks: set[asyncio.Task[object]] = set()
        self._no_tasks = anyio.Event()
        self._no_tasks.set()
        #: Why this process stopped claiming for good (its keys cannot open the fleet's
        #: runs), or None. ``/readyz`` reports it; a restart with the right keys clears it.
        self.refusal: str | None = None
        #: Runs claimed ahead of a free slot, oldest claim first: (claimed at, execution).
        self._ready: deque[tuple[float, Execution]] = deque()
        #: How long a claim takes lately (seconds, a moving average; None: none yet).
        self._claim_seconds: float | None = None
        #: Runs asked for by claims still in flight (the other loop must not ask again).
        self._asked = 0
        #: Set when runs claimed ahead had to be given back, cleared when a handler ends:
        #: while every slot is held by slow handlers that have not finished yet (so the
        #: handler average has not caught up), nothing more is claimed ahead.
        self._ahead_held_back = False

    @property
    def executor(self) -> Executor:
        return self.runtime.executor

    @property
    def inflight(self) -> InFlight:
        return self.runtime.inflight

    def free_slots(self) -> int:
        """Handlers may execute ``max_concurrency`` at once. A run whose handler returned frees
        its slot while its completion waits for the batched write, so the next claim overlaps
        that write (a cap of ``max_concurrency`` on waiting rows cost a third of the drain).
        At most the completer's batches in flight more may wait: the rows this worker holds
        ``running`` stay bounded by ``max_concurrency + max_pending``."""
        limit = self.config.max_concurrency
        held = limit + self.runtime.completer.config.max_pending
        return min(limit - self.inflight.executing, held - len(self.inflight))

    def ahead(self) -> int:
        """Runs to claim beyond the free slots: as many as are expected to free up while a
        claim is in flight; none while handlers take longer than claims, none before both
        were seen, and none under a run-count budget (it claims one run at a time)."""
        if not self.config.claim_ahead or self.runtime.budget.caps_runs:
            return 0
        if self._ahead_held_back:
            return 0
        handler, claim = self.inflight.handler_seconds, self._claim_seconds
        if handler is None or claim is None:
            return 0
        limit = self.config.max_concurrency
        return min(CLAIM_LOOPS * limit, int(limit * claim / max(handler, 1e-6)))

    def claim_size(self) -> int:
        """How many runs the next claim asks for: the free slots not promised to runs
        claimed ahead already, plus ``ahead()``. The rows held ``running`` stay bounded by
        ``max_concurrency + max_pending + ahead()``."""
        limit = self.config.max_concurrency
        ahead = self.ahead()
        inflight = self.inflight
        wanted = limit + ahead - inflight.executing - inflight.waiting - self._asked
        held = limit + ahead + self.runtime.completer.config.max_pending
        return max(0, min(wanted, held - len(inflight) - self._asked))

    def slot_freed(self) -> None:
        """A handler finished: give its slot to a run claimed ahead, and wake the claimer."""
        self._ahead_held_back = False
        self.start_ready()
        self.wake()

    def start_ready(self) -> None:
        """Start runs claimed ahead in the free slots, oldest claim first."""
        free = self.config.max_concurrency - self.inflight.executing
        if free <= 0 or not self._ready:
            return
        started: list[Execution] = []
        while self._ready and len(started) < free:
            execution = self._ready.popleft()[1]
            self.inflight.start(execution)
            started.append(execution)
        self.executor.arm_deadline(started)
        for execution in started:
            self._start(execution, counted=False)

    def wake(self) -> None:
        for event in self._wakes:
            event.set()

    def stop(self) -> None:
        """Stop claiming (the drain); runs already started go on."""
        self._stopping = True
        self.wake()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _blocked(self) -> BudgetBlock | None:
        budget = self.runtime.budget
        return await budget.blocked() if budget.enabled else None

    async def claim_once(self, executions: TaskGroup) -> int:
        """One pass: claim what ``claim_size`` asks and start what the free slots take; the
        rest waits for slots. Returns how many runs were claimed."""
        self.start_ready()  # slots freed since the last look go to runs claimed ahead first
        wanted = self.claim_size()
        if wanted <= 0 or self.refusal is not None:
            return 0
        if self.runtime.budget.caps_runs:
            return await self._claim_counting(self.free_slots())
        started = time.monotonic()
        self._asked += wanted
        try:
            runs = await self.store.claim(
                self.runtime.worker_id,
                wanted,
                deployment_id=self.config.deployment_id,
                serialize_sessions=self.config.serialize_sessions,
                blocked=await self._blocked(),
            )
        finally:
            self._asked -= wanted
        claimed_at = time.monotonic()
        self._note_claim_seconds(claimed_at - started)
        self._note_unopenable(runs)
        if runs:
            CLAIMS.inc(len(runs))
            # Admitted now, not when a task first runs: the next pass's count of free
            # slots must include these runs, or a second claim would exceed the cap. Each
            # waits its turn behind runs claimed earlier.
            for run in runs:
                self._ready.append((claimed_at, self.executor.admit(run, waiting=True)))
            self.start_ready()
        return len(runs)

    def _note_claim_seconds(self, seconds: float) -> None:
        self._claim_seconds = moving_average(self._claim_seconds, seconds, CLAIM_SECONDS_WEIGHT)

    async def _give_back_stale(self) -> None:
        """Give back runs claimed ahead that waited too long for a slot (handlers turned
        slow): another replica may start them."""
        cutoff = time.monotonic() - AHEAD_MAX_WAIT_SECONDS
        stale: list[tuple[float, Execution]] = []
        while self._ready and self._ready[0][0] <= cutoff:
            stale.append(self._ready.popleft())
        if stale:
            await self._give_back(stale, reason="no_free_slot")

    async def _give_back(self, waiting: list[tuple[float, Execution]], *, reason: str) -> bool:
        """Queued again with the attempt not spent; on a database error they go back to
        the front of ``_ready`` (leases renewed) and wait again. True when given back."""
        executions = [execution for _, execution in waiting]
        try:
            await self.store.give_back(self.runtime.worker_id, [ex.lease for ex in executions])
        except Exception as e:
            STORE_ERRORS.labels(service="claimer").inc()
            # Always a warning: a give-back whose answer was lost may repeat an attempt.
            log.warning(
                "claim.give_back_failed", runs=len(executions), error=str(e) or type(e).__name__
            )
            self._ready.extendleft(reversed(waiting))
            return False
        for execution in executions:
            self.inflight.remove(execution)
        self._ahead_held_back = True
        log.info("claim.given_back", runs=len(executions), reason=reason)
        return True

    async def _settle_ready_at_stop(self) -> None:
        """The drain: runs still waiting for a slot go back to the queue; when the database
        cannot take them back, they run like the runs already started."""
        if not self._ready:
            return
        waiting = list(self._ready)
        self._ready.clear()
        with anyio.CancelScope(shield=True):
            if await self._give_back(waiting, reason="drain"):
                return
        self._ready.clear()  # the failed give-back put them back
        for _, execution in waiting:
            self.inflight.start(execution)
            self._start(execution, counted=False)

    def _note_unopenable(self, runs: ClaimedRuns) -> None:
        """Stop claiming when a claim took runs this process cannot open. The store gave them
        back (queued, attempt not spent); claiming on would only take them again and again,
        and would starve the replicas that can open them of nothing but time."""
        unopenable = runs.unopenable
        if not unopenable:
            return
        UNOPENABLE_RUNS.inc(len(unopenable))
        if self.refusal is None:
            self.refusal = (
                f"claimed run {unopenable[0]} cannot be opened with this process's seal.keys;"
                " claiming stopped (restart with the fleet's keys)"
            )
            log.error("claim.unopenable", runs=list(unopenable), detail=self.refusal)

    def _start(self, execution: Execution, *, counted: bool) -> None:
        coro = self.executor.run_admitted(execution, counted=counted, hand_in=True)
        task: asyncio.Task[object] = asyncio.get_running_loop().create_task(coro)
        if not self._tasks:
            self._no_tasks = anyio.Event()
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._no_tasks.set()
        if not task.cancelled() and task.exception() is not None:
            # run_admitted catches the run's own errors; anything else is a bug worth a line.
            log.error("run.task_failed", error=repr(task.exception()))

    async def _hold_runs(self) -> None:
        """Lives in the executions group while runs do: when the group is cancelled (the end
        of a drain), the runs' tasks are cancelled and waited for, as the group's own tasks
        were. A run settling a shutdown write is left to finish it (shielded)."""
        try:
            while not (self._stopping and not self._tasks):
                await self._no_tasks.wait()
                if not self._stopping:
                    await self._stopped.wait()
        finally:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait(tasks)

    async def _claim_counting(self, free: int) -> int:
        """Claim one run at a time, counting each against ``max_runs`` before the next claim:
        one statement for many slots would let a user with one run left take them all."""
        claimed = 0
        while claimed < free:
            runs = await self.store.claim(
                self.runtime.worker_id,
                1,
                deployment_id=self.config.deployment_id,
                serialize_sessions=self.config.serialize_sessions,
                blocked=await self._blocked(),
            )
            self._note_unopenable(runs)
            if not runs:
                break
            CLAIMS.inc()
            claimed += 1
            await self.executor.count_first_claim(runs[0])
            execution = self.executor.admit(runs[0])
            self.executor.arm_deadline([execution])
            self._start(execution, counted=True)
        return claimed

    async def run(
        self, executions: TaskGroup, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Claim until ``stop()``. Reports started after the first pass (readiness). While
        claiming ahead, ``CLAIM_LOOPS`` claim loops run, so claims overlap."""
        CONCURRENCY_LIMIT.set(self.config.max_concurrency)
        # Read when scraped: a gauge moved per run took a lock twice per run.
        IN_FLIGHT.set_function(self.inflight.__len__)
        executions.start_soon(self._hold_runs)
        # One claim at a time where claims must be counted one by one (run-count budgets).
        loops = CLAIM_LOOPS if self.config.claim_ahead and not self.runtime.budget.caps_runs else 1
        self._wakes = [anyio.Event() for _ in range(loops)]
        try:
            async with anyio.create_task_group() as claim_loops:
                await claim_loops.start(self._claim_loop, executions, 0)
                task_status.started()
                for index in range(1, loops):
                    claim_loops.start_soon(self._claim_loop, executions, index)
        finally:
            await self._settle_ready_at_stop()
            self._stopped.set()

    async def _claim_loop(
        self,
        executions: TaskGroup,
        index: int,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        retry = Retry(CLAIM_BACKOFF, metric="claimer", event="claim.failed")
        started = False

        async def one_pass() -> float:
            """One claim pass; the seconds to sleep after it (0: claim again at once)."""
            nonlocal started
            self._wakes[index] = anyio.Event()
            asked = self.claim_size()
            try:
                claimed = await self.claim_once(executions)
            finally:
                self._pass_done()
                if not started:
                    started = True
                    task_status.started()
            await self._give_back_stale()
            if claimed >= asked > 0 and self.claim_size() > 0:
                return 0.0  # a full pass: more may be waiting for the slots still free
            # A pass that took fewer runs than it asked for saw none left to take: sleep
            # (a submission since then has set the fresh wake event, so this returns at
            # once). Claiming again at once cost every wake-up an empty claim round
            # trip, which the next wake-up's claim could queue behind.
            poll = self.config.poll_interval
            return min(poll, AHEAD_MAX_WAIT_SECONDS) if self._ready else poll

        await run_periodically(
            one_pass,
            retry=retry,
            interval=lambda seconds: seconds,
            sleep=lambda seconds: self._sleep(index, seconds),
            stopped=lambda: self._stopping,
        )

    def _pass_done(self) -> None:
        """A claim pass ended, claimed or not, failed or not (the signal tests wait on)."""
        self.passes += 1
        CLAIM_PASSES.inc()

    async def _sleep(self, index: int, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self._wakes[index].wait()


# -- the bounded sweep of `runq work` ------------------------------------------------------------


@dataclass
class SweepReport:
    claimed: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    stopped_by: str = "empty"  # empty | limit | time_limit

    def as_dict(self) -> dict[str, object]:
        return {
            "claimed": self.claimed,
            "outcomes": dict(self.outcomes),
            "seconds": round(self.seconds, 3),
            "stopped_by": self.stopped_by,
        }


async def sweep(
    store: Store,
    runtime: WorkerRuntime,
    *,
    limit: int,
    time_limit: float,
    deployment_id: str | None,
    serialize_sessions: bool = True,
) -> SweepReport:
    """Claim oldest first and execute, one run at a time, until the queue has nothing
    claimable, ``limit`` runs were claimed, or ``time_limit`` seconds passed (no new claim
    after it; the run in progress finishes). Claim errors propagate."""
    report = SweepReport()
    started = time.monotonic()
    async with runtime.active():
        while True:
            if report.claimed >= limit:
                report.stopped_by = "limit"
                break
            if time.monotonic() - started >= time_limit:
                report.stopped_by = "time_limit"
                break
            blocked = await runtime.budget.blocked() if runtime.budget.enabled else None
            runs: list[Run] = await store.claim(
                runtime.worker_id,
                1,
                deployment_id=deployment_id,
                serialize_sessions=serialize_sessions,
                blocked=blocked,
            )
            if not runs:
                report.stopped_by = "empty"
                break
            CLAIMS.inc()
            report.claimed += 1
            outcome = await runtime.executor.execute(runs[0])
            report.outcomes[outcome.kind] += 1
    report.seconds = time.monotonic() - started
    return report
