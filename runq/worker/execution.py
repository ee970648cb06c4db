"""One execution of a claimed run: its hooks for ``RunContext``, its deadline, and the
outcome types the executor settles it to.
"""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.lowlevel

from runq.config import Config
from runq.errors import LeaseLost, RunCancelled, RunInterrupted
from runq.log import get_logger
from runq.metrics import FENCED_WRITES
from runq.model import Lease, Run
from runq.worker.events import EventWriter

if TYPE_CHECKING:
    from runq.limits.budget import BudgetGate, BudgetLeft
    from runq.store.base import Store
    from runq.worker.events import EventBatcher

log = get_logger("runq.worker.executor")  # one logger name for the whole executor


class Interrupt(enum.StrEnum):
    """Why an execution is told to stop before its handler returns."""

    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"


class ExecutionHost(Protocol):
    """What an execution needs of the executor that runs it (``Executor`` is one): the
    store and worker id for its own writes, the budget, the lease renewal nudge and the
    event batcher. A protocol, so this module does not import the executor back."""

    store: Store
    worker_id: str
    budget: BudgetGate | None
    renew_soon: Callable[[], None] | None

    def event_batcher(self) -> EventBatcher: ...


SHUTDOWN_ERROR = "interrupted by worker shutdown"

#: ``ctx.checkpoint()`` renews the lease at most this often.
CHECKPOINT_RENEW_SECONDS = 1.0

MAX_ERROR_CHARS = 2000


class WorkerShutdown(RunInterrupted):
    """Raised by ``checkpoint()`` while the worker drains and this run is a straggler."""

    def __init__(self) -> None:
        super().__init__(SHUTDOWN_ERROR)


_INTERRUPT_ERRORS: dict[Interrupt, Callable[[], RunInterrupted]] = {
    Interrupt.CANCELLED: RunCancelled,
    Interrupt.LEASE_LOST: LeaseLost,
    Interrupt.SHUTDOWN: WorkerShutdown,
}


class Deadline:
    """One timer for the handler deadline of a claimed batch (they share a start), instead
    of a timer and a cancel scope per run; cancelled once every handler of the batch ended,
    so a drained batch leaves nothing armed on the loop."""

    __slots__ = ("_executions", "_handle", "_open")

    def __init__(self, executions: list[Execution], seconds: float) -> None:
        self._executions = executions
        self._open = len(executions)
        self._handle = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _expire(self) -> None:
        for execution in self._executions:
            execution.time_out()

    def handler_ended(self) -> None:
        self._open -= 1
        if self._open <= 0:
            self._handle.cancel()
            self._executions = []


@dataclass(eq=False, slots=True)
class Execution:
    """One attempt of one run in this process; the hooks its ``RunContext`` calls.

    The handler runs in the execution's own task, with no cancel scope: an interrupt (a
    cancel, a lost lease, the drain) or the deadline cancels that task while the handler is
    being called, and records why, so the reason decides the outcome whatever the handler
    raised meanwhile."""

    run: Run
    executor: ExecutionHost
    interrupted: Interrupt | None = None
    timed_out: bool = False
    shutdown_requested: bool = False
    thread_done: threading.Event | None = None
    last_renewal: float = field(default_factory=time.monotonic)
    #: The handler is done and its completion handed to the completer: the run no longer
    #: takes an execution slot, though its lease is held (and renewed) until it is written.
    handed_in: bool = False
    #: Claimed ahead of a free slot (``Claimer``): in flight, its lease renewed, but its
    #: handler not started and no slot taken yet.
    waiting: bool = False
    #: The task calling the handler, while it does; what an interrupt cancels.
    calling: asyncio.Task[Any] | None = None
    cancel_sent: bool = False
    handler_over: bool = False
    deadline: Deadline | None = None
    started: float = 0.0
    #: The batching writer of ``ctx.emit``, made at the first event.
    events: EventWriter | None = None

    @property
    def lease(self) -> Lease:
        return self.run.lease

    async def emit(self, kind: str, data: Any) -> None:
        if self.events is None:
            self.events = self.executor.event_batcher().writer(
                self.lease, lambda: self.interrupt(Interrupt.LEASE_LOST)
            )
        await self.events.emit(kind, data)

    def interrupt(self, reason: Interrupt) -> None:
        """Stop the handler; the first reason decides the outcome."""
        if reason is Interrupt.SHUTDOWN:
            self.shutdown_requested = True
        if self.interrupted is None:
            self.interrupted = reason
        self._stop_handler()

    def time_out(self) -> None:
        """The handler deadline passed (before an interrupt, which would decide instead)."""
        if not self.handler_over:
            self.timed_out = True
            self._stop_handler()

    def _stop_handler(self) -> None:
        task = self.calling
        # From inside the handler's own task (a checkpoint that learns of a lost lease) the
        # caller raises the interrupt itself; a cancel would hit its next await as well.
        if task is None or self.cancel_sent or task is asyncio.current_task():
            return
        self.cancel_sent = True
        task.cancel()

    def _raise_if_interrupted(self) -> None:
        if self.interrupted is not None:
            raise _INTERRUPT_ERRORS[self.interrupted]()

    async def checkpoint(self) -> None:
        self._raise_if_interrupted()
        await anyio.lowlevel.checkpoint()
        if time.monotonic() - self.last_renewal >= CHECKPOINT_RENEW_SECONDS:
            self.last_renewal = time.monotonic()
            await self._renew()
        self._raise_if_interrupted()

    async def _renew(self) -> None:
        ex = self.executor
        try:
            result = await ex.store.heartbeat_many(ex.worker_id, [self.lease])
        except Exception as e:
            # The heartbeat loop keeps trying; a checkpoint must not fail the run for it.
            log.debug("checkpoint.renew_failed", run_id=self.run.id, error=str(e))
            return
        if self.lease in result.lost:
            self.interrupt(Interrupt.LEASE_LOST)
        elif self.run.id in result.cancel_requested:
            self.interrupt(Interrupt.CANCELLED)

    async def set_non_idempotent(self, inside: bool) -> None:
        ex = self.executor
        if not await ex.store.set_non_idempotent(ex.worker_id, self.lease, inside):
            FENCED_WRITES.labels(verb="set_non_idempotent").inc()
            self.interrupt(Interrupt.LEASE_LOST)
            raise LeaseLost()

    async def record_usage(self, tokens: int, cost: float) -> None:
        ex = self.executor
        keys = []
        if ex.budget is not None and ex.budget.enabled:
            keys = ex.budget.usage_keys(
                self.run.user_id, self.run.configuration, await ex.store.now()
            )
        await ex.store.record_usage(ex.worker_id, self.lease, tokens=tokens, cost=cost, keys=keys)
        if ex.budget is not None:
            ex.budget.invalidate()

    async def budget_left(self) -> BudgetLeft | None:
        budget = self.executor.budget
        if budget is None:
            return None
        return await budget.left(self.run.user_id, self.run.configuration)

    def renew_lease_soon(self) -> None:
        self.last_renewal = 0.0
        if self.executor.renew_soon is not None:
            self.executor.renew_soon()


@dataclass(frozen=True)
class Answer:
    value: Any


@dataclass(frozen=True)
class Raised:
    error: BaseException


@dataclass(frozen=True)
class Interrupted:
    reason: Interrupt


@dataclass(frozen=True)
class TimedOut:
    seconds: float


ExecutionResult = Answer | Raised | Interrupted | TimedOut


@dataclass(frozen=True)
class Outcome:
    """How one execution ended: ``kind`` is the metrics outcome (completed, failed,
    cancelled, paused, retried, lost, unsettled); ``applied`` False when fenced off."""

    kind: str
    termination_reason: str = ""
    applied: bool = True
    error: str | None = None


def error_text(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"


@dataclass(frozen=True)
class ExecutorConfig:
    #: A handler still running after this many seconds is cancelled (``[queue] timeout_seconds``).
    timeout_seconds: float
    #: How long a settle write is retried while the database is away; None: until the
    #: database decides it (the daemon, see ``Executor._durable``).
    settle_timeout_seconds: float | None
    #: Plain-function handlers run in at most this many threads (``[queue] max_concurrency``).
    max_threads: int
    #: Base of the full-jitter retry delay (``[queue] retry_delay_seconds``).
    retry_delay_seconds: float
    #: What of an answer is kept (``[privacy] level`` and ``redacted_max_chars``).
    privacy_level: str
    redacted_max_chars: int
    #: ``[privacy] keep_answer_after_approval``: a continued run's answer is kept only then.
    keep_answer_after_approval: bool

    @classmethod
    def from_config(cls, config: Config, *, settle_until_decided: bool = False) -> ExecutorConfig:
        """``settle_until_decided``: a serving daemon retries a settle write until the
        database decides it, since an outage longer than the lease grace must not turn
        finished runs into retries; a waiting caller (``runq work``, the ``sync``
        transport) gives up after one lease grace and leaves the run to the reaper."""
        q = config.queue
        return cls(
            timeout_seconds=q.timeout_seconds,
            settle_timeout_seconds=None if settle_until_decided else q.lock_grace_seconds,
            max_threads=max(q.max_concurrency, 1),
            retry_delay_seconds=q.retry_delay_seconds,
            privacy_level=config.privacy.level,
            redacted_max_chars=config.privacy.redacted_max_chars,
            keep_answer_after_approval=config.privacy.keep_answer_after_approval,
        )


def format_exception(error: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(error)).rstrip()
