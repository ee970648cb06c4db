"""The executor: one claimed run, from handler call to its settled outcome.

This is the one code path of the daemon's claimers, ``runq work`` and the ``sync``
transport. For each run it:

1. registers the execution in the ``InFlight`` registry, whose leases the heartbeat loop
   renews (one statement for all of them);
2. settles at once a run that cannot execute: an unknown component (``not_retryable``),
   or a cancel recorded before the claim (``cancelled``, visibly, before any work);
3. calls the handler inside a cancel scope under ``timeout_seconds``: coroutine handlers
   on the loop, plain functions in a worker thread (they cannot be interrupted, so the
   run keeps its slot and lease until the thread returns, and a retry never overlaps it);
4. settles the outcome with one fenced write: complete (answer filtered by
   ``[privacy] level``, batched by the completer), fail (retryable with full-jitter
   backoff, or not), pause, or cancelled. A lost lease writes nothing.

A cancel, a lost lease or the drain cancels the execution's scope (``Execution.interrupt``);
the interrupt decides the outcome even when the handler raised something else meanwhile.
An exception's message becomes the run's ``error``; its traceback goes to the log only.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.lowlevel
import msgspec

from runq.backoff import backoff_delay
from runq.components import ComponentRegistry, Handler, is_async_handler
from runq.config import Config
from runq.context import RunContext
from runq.errors import (
    BudgetExhausted,
    LeaseLost,
    PauseRequested,
    Permanent,
    Retryable,
    RunCancelled,
    RunInterrupted,
)
from runq.log import get_logger
from runq.metrics import (
    FENCED_WRITES,
    LEASES_LOST,
    QUEUE_WAIT,
    RUN_DURATION,
    RUNS_FINISHED,
    STORE_ERRORS,
)
from runq.model import Completion, FailOutcome, Lease, Run, TerminationReason, retry_delay
from runq.privacy import keep_answer_async, keep_error
from runq.store.base import Store
from runq.worker.completer import TRANSIENT_ERRORS, Completer, WriteResult
from runq.worker.events import EventBatcher, EventWriter
from runq.worker.inflight import InFlight, Interrupt

if TYPE_CHECKING:
    from runq.budget import BudgetGate, BudgetLeft

log = get_logger(__name__)
#: Checked before building the keyword arguments of a per-run log line: at thousands of
#: runs a second even building them showed in the profile.
_stdlib_log = logging.getLogger(__name__)

T = TypeVar("T")

SHUTDOWN_ERROR = "interrupted by worker shutdown"
#: ``ctx.checkpoint()`` renews the lease at most this often.
CHECKPOINT_RENEW_SECONDS = 1.0
MAX_ERROR_CHARS = 2000
#: How often a cancelled or timed-out execution looks whether its handler thread returned.
THREAD_POLL_SECONDS = 0.05
#: Outcomes after which a run's events are trimmed to the privacy level.
_SETTLED = frozenset({"completed", "failed", "cancelled"})


class WorkerShutdown(RunInterrupted):
    """Raised by ``checkpoint()`` while the worker drains and this run is a straggler."""

    def __init__(self) -> None:
        super().__init__(SHUTDOWN_ERROR)


_INTERRUPT_ERRORS: dict[Interrupt, Callable[[], RunInterrupted]] = {
    Interrupt.CANCELLED: RunCancelled,
    Interrupt.LEASE_LOST: LeaseLost,
    Interrupt.SHUTDOWN: WorkerShutdown,
}

_threads_lock = threading.Lock()
_live_threads = [0]


def live_handler_threads() -> int:
    """Plain-function handlers still running (possibly abandoned by a drain)."""
    with _threads_lock:
        return _live_threads[0]


# Labelled metric children, looked up once per label set: ``.labels()`` on every run showed
# up in the worker's profile. Label values are bounded (component types, outcomes, reasons).
@functools.cache
def _queue_wait(component_type: str) -> Any:
    return QUEUE_WAIT.labels(component_type=component_type)


@functools.cache
def _run_duration(component_type: str, outcome: str) -> Any:
    return RUN_DURATION.labels(component_type=component_type, outcome=outcome)


@functools.cache
def _runs_finished(outcome: str, termination_reason: str) -> Any:
    return RUNS_FINISHED.labels(outcome=outcome, termination_reason=termination_reason)


# -- one execution -----------------------------------------------------------------------


class _Deadline:
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
    executor: Executor
    interrupted: Interrupt | None = None
    timed_out: bool = False
    shutdown_requested: bool = False
    thread_done: threading.Event | None = None
    last_renewal: float = field(default_factory=time.monotonic)
    #: The handler is done and its completion handed to the completer: the run no longer
    #: takes an execution slot, though its lease is held (and renewed) until it is written.
    handed_in: bool = False
    #: The task calling the handler, while it does; what an interrupt cancels.
    calling: asyncio.Task[Any] | None = None
    cancel_sent: bool = False
    handler_over: bool = False
    deadline: _Deadline | None = None
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


# -- what an invocation ended with -----------------------------------------------------------


@dataclass(frozen=True)
class _Answer:
    value: Any


@dataclass(frozen=True)
class _Raised:
    error: BaseException


@dataclass(frozen=True)
class _Interrupted:
    reason: Interrupt


@dataclass(frozen=True)
class _TimedOut:
    seconds: float


_Result = _Answer | _Raised | _Interrupted | _TimedOut


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


# -- the executor --------------------------------------------------------------------------


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
        )


class Executor:
    def __init__(
        self,
        *,
        store: Store,
        config: ExecutorConfig,
        components: ComponentRegistry,
        worker_id: str,
        inflight: InFlight,
        completer: Completer,
        budget: BudgetGate | None = None,
        on_finished: Callable[[], None] | None = None,
        renew_soon: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.components = components
        self.worker_id = worker_id
        self.inflight = inflight
        self.completer = completer
        self.budget = budget
        self.on_finished = on_finished
        self.renew_soon = renew_soon
        self._limiter = anyio.CapacityLimiter(config.max_threads)
        self._async_handlers: dict[int, bool] = {}
        self._event_batcher: EventBatcher | None = None

    def event_batcher(self) -> EventBatcher:
        """The one writer of every execution's ``ctx.emit`` events (made at first use)."""
        if self._event_batcher is None:
            self._event_batcher = EventBatcher(self.store, self.worker_id)
        return self._event_batcher

    def _fields(self, run: Run) -> dict[str, Any]:
        return {"run_id": run.id, "attempt": run.attempt, "worker_id": self.worker_id}

    def admit(self, run: Run) -> Execution:
        """Register a claimed run as in flight, synchronously: the claimer calls this before it
        starts the task, so the next free-slot count already includes the run."""
        execution = Execution(run, self)
        self.inflight.add(execution)
        return execution

    def arm_deadline(self, executions: list[Execution]) -> None:
        """One handler deadline for runs claimed together (``timeout_seconds`` from now)."""
        if executions:
            deadline = _Deadline(executions, self.config.timeout_seconds)
            for execution in executions:
                execution.deadline = deadline

    async def execute(self, run: Run, *, counted: bool = False) -> Outcome:
        """Execute one claimed run to a settled outcome. Never raises for the run's own
        failures; raises only when this process is being cancelled. ``counted``: the claimer
        already added this claim to the budget's run counters."""
        execution = self.admit(run)
        self.arm_deadline([execution])
        outcome = await self.run_admitted(execution, counted=counted)
        assert outcome is not None  # not handed in: it waited for its write
        return outcome

    async def run_admitted(
        self, execution: Execution, *, counted: bool = False, hand_in: bool = False
    ) -> Outcome | None:
        """``execute`` for a run already registered with ``admit``. ``hand_in``: a completion
        goes to the batching completer and this returns None at once; the completer's
        callback finishes the run (the claimer's runs: nothing waits for their outcome)."""
        run = execution.run
        execution.started = time.monotonic()
        if run.started_at is not None:
            _queue_wait(run.component_type).observe(max(run.started_at - run.available_at, 0.0))
        if _stdlib_log.isEnabledFor(logging.DEBUG):
            log.debug("run.started", component=run.component, **self._fields(run))
        outcome: Outcome | None = None
        pending = False  # handed to the completer, whose callback finishes the run
        try:
            outcome = await self._execute(execution, counted=counted, hand_in=hand_in)
            pending = outcome is None
        except Exception as e:
            # A bug here must not take the daemon down with one run.
            log.error("run.executor_error", exc=_format_exception(e), **self._fields(run))
            outcome = Outcome("unsettled", applied=False, error=error_text(e))
        finally:
            if execution.events is not None:
                execution.events.abandon()
            if not pending:
                self._release(execution)
        if outcome is not None:
            self._finished(execution, outcome)
        return outcome

    def _release(self, execution: Execution) -> None:
        self.inflight.remove(execution)
        if self.on_finished is not None:
            self.on_finished()

    def _finished(self, execution: Execution, outcome: Outcome) -> None:
        run = execution.run
        elapsed = time.monotonic() - execution.started
        _run_duration(run.component_type, outcome.kind).observe(elapsed)
        _runs_finished(outcome.kind, outcome.termination_reason).inc()
        if outcome.kind == "completed":
            # The line operators grep for. At thousands of runs a second it must stay cheap:
            # when INFO is off, one cached level check and no fields are built.
            if _stdlib_log.isEnabledFor(logging.INFO):
                log.info(
                    "run.completed",
                    component=run.component,
                    seconds=round(elapsed, 3),
                    **self._fields(run),
                )
            return
        log.info(
            "run.finished",
            outcome=outcome.kind,
            termination_reason=outcome.termination_reason or None,
            seconds=round(elapsed, 3),
            **self._fields(run),
        )

    async def _execute(self, ex: Execution, *, counted: bool, hand_in: bool) -> Outcome | None:
        run = ex.run
        if not counted:
            await self.count_first_claim(run)
        handler = self.components.get(run.component_type, run.component_id)
        if handler is None:
            self._handler_ended(ex)
            return await self._fail(ex, f"unknown component {run.component}", retryable=False)
        if run.cancel_requested:
            # A cancel recorded before this claim (a requeue kept it): stop visibly, before
            # any work, as at a first checkpoint.
            self._handler_ended(ex)
            return await self._settle_cancelled(ex)
        result = await self._invoke(ex, handler)
        if ex.events is not None:
            await ex.events.close()  # every event before the outcome: the final one is last
        batching = hand_in and self.completer.running and not ex.shutdown_requested
        if batching and isinstance(result, _Answer) and not self._must_trim(ex):
            return await self._hand_in(ex, result.value, TerminationReason.COMPLETED)
        outcome = await self._settle(ex, result)
        await self._trim_events(ex, outcome)
        return outcome

    def _must_trim(self, ex: Execution) -> bool:
        """True when a settled run's events must be cut to ``[privacy] level``: handler data
        in this attempt or an earlier one, or lifecycle details the level drops (``none``).
        Such a run settles directly, so the trim follows its write; the others batch."""
        level = self.config.privacy_level
        if level == "full":
            return False
        emitted = ex.events is not None and ex.events.wrote_data
        return emitted or ex.run.attempt > 1 or level == "none"

    async def _trim_events(self, ex: Execution, outcome: Outcome) -> None:
        """Cut a settled run's events to ``[privacy] level`` (see ``_must_trim``)."""
        if outcome.kind not in _SETTLED or not outcome.applied or not self._must_trim(ex):
            return
        try:
            await self.store.trim_events(
                ex.run.id, self.config.privacy_level, self.config.redacted_max_chars
            )
        except Exception as e:  # the run is settled; its events wait for the next settle
            log.warning("run.trim_events_failed", error=error_text(e), **self._fields(ex.run))

    async def count_first_claim(self, run: Run) -> None:
        """Add a run's first claim to the budget's run counters (max_runs caps)."""
        if self.budget is None or not self.budget.enabled or run.attempt != 1:
            return
        try:
            # The claim stamped the database clock on the row: the run counts in the period
            # it was claimed in, without another round trip to read the clock.
            claimed_at = run.started_at if run.started_at is not None else await self.store.now()
            keys = self.budget.usage_keys(run.user_id, run.configuration, claimed_at)
            await self.store.count_claimed_run(keys)
            self.budget.invalidate()
        except Exception as e:
            log.warning("budget.count_failed", error=error_text(e), **self._fields(run))

    # -- calling the handler ---------------------------------------------------------------

    def _context(self, ex: Execution) -> RunContext:
        run = ex.run
        return RunContext(
            run_id=run.id,
            attempt=run.attempt,
            component_type=run.component_type,
            component_id=run.component_id,
            actor=run.actor,
            session_id=run.session_id,
            configuration=run.configuration,
            resume=run.resume,
            payload=run.payload,
            hooks=ex,
        )

    def _is_async(self, handler: Handler) -> bool:
        # Once per handler, not ``inspect`` per run.
        key = id(handler)
        known = self._async_handlers.get(key)
        if known is None:
            known = self._async_handlers[key] = is_async_handler(handler)
        return known

    def _handler_ended(self, ex: Execution) -> None:
        ex.handler_over = True
        if ex.deadline is not None:
            ex.deadline.handler_ended()
            ex.deadline = None

    async def _invoke(self, ex: Execution, handler: Handler) -> _Result:
        ctx = self._context(ex)
        task = asyncio.current_task()
        result: _Result
        try:
            if ex.interrupted is not None or ex.timed_out:
                result = _Raised(RuntimeError("handler was not started"))
            else:
                ex.calling = task
                if self._is_async(handler):
                    result = _Answer(await handler(ctx, ctx.payload))
                else:
                    result = _Answer(await self._call_in_thread(handler, ctx, ex))
        except asyncio.CancelledError:
            if not ex.cancel_sent:
                raise  # not ours: this process is being cancelled
            result = _Raised(RuntimeError("handler was cancelled"))
        except Exception as e:
            result = _Raised(e)
        except RunInterrupted as e:
            result = _Raised(e)
        finally:
            ex.calling = None
            self._handler_ended(ex)
        if ex.cancel_sent and task is not None and task.uncancel() > 0:
            # Our interrupt was taken; a cancel of the task itself came too: let it go on.
            raise asyncio.CancelledError
        if ex.interrupted is not None:
            result = _Interrupted(ex.interrupted)
        elif ex.timed_out and not isinstance(result, _Answer):
            result = _TimedOut(self.config.timeout_seconds)
        await self._wait_for_thread(ex, result)
        return result

    async def _call_in_thread(self, handler: Handler, ctx: RunContext, ex: Execution) -> Any:
        done = threading.Event()
        ex.thread_done = done

        def call() -> Any:
            with _threads_lock:
                _live_threads[0] += 1
            try:
                return handler(ctx, ctx.payload)
            finally:
                with _threads_lock:
                    _live_threads[0] -= 1
                done.set()

        # abandon_on_cancel: the await ends when the task is cancelled; _wait_for_thread
        # then decides whether to keep waiting for the thread (it cannot be interrupted).
        return await anyio.to_thread.run_sync(call, abandon_on_cancel=True, limiter=self._limiter)

    async def _wait_for_thread(self, ex: Execution, result: _Result) -> None:
        """Hold slot and lease until an interrupted plain function returns, so a retry or
        requeue never runs beside it. Not on a lost lease (it is gone) nor in the drain."""
        done = ex.thread_done
        if done is None or done.is_set():
            return
        if isinstance(result, _Interrupted) and result.reason is not Interrupt.CANCELLED:
            return
        log.info("run.waiting_for_thread", **self._fields(ex.run))
        while not done.is_set() and not ex.shutdown_requested:
            if ex.interrupted is Interrupt.LEASE_LOST:
                return
            await anyio.sleep(THREAD_POLL_SECONDS)

    # -- settling ---------------------------------------------------------------------------

    async def _settle(self, ex: Execution, result: _Result) -> Outcome:
        if ex.shutdown_requested and not isinstance(result, _Answer):
            return await self._fail(ex, SHUTDOWN_ERROR, retryable=True, delay=0.0)
        if isinstance(result, _Answer):
            return await self._complete(ex, result.value, TerminationReason.COMPLETED)
        if isinstance(result, _TimedOut):
            return await self._fail(ex, f"timed out after {result.seconds:g} s", retryable=True)
        if isinstance(result, _Interrupted):
            return await self._settle_interrupt(ex, result.reason)
        return await self._settle_raised(ex, result.error)

    async def _settle_interrupt(self, ex: Execution, reason: Interrupt) -> Outcome:
        if reason is Interrupt.CANCELLED:
            return await self._settle_cancelled(ex)
        if reason is Interrupt.SHUTDOWN:
            return await self._fail(ex, SHUTDOWN_ERROR, retryable=True, delay=0.0)
        LEASES_LOST.inc()
        log.warning("run.lease_lost", **self._fields(ex.run))
        return Outcome("lost", applied=False)

    async def _settle_raised(self, ex: Execution, error: BaseException) -> Outcome:
        if isinstance(error, PauseRequested):
            return await self._pause(ex, error)
        if isinstance(error, BudgetExhausted):
            return await self._complete(
                ex, error.partial_answer, TerminationReason.BUDGET_EXHAUSTED
            )
        if isinstance(error, RunCancelled):
            return await self._settle_cancelled(ex)
        if isinstance(error, LeaseLost):
            return await self._settle_interrupt(ex, Interrupt.LEASE_LOST)
        if isinstance(error, RunInterrupted):
            return await self._fail(ex, SHUTDOWN_ERROR, retryable=True, delay=0.0)
        # A handler's message may quote the payload: it is kept as the privacy level says.
        message = keep_error(self.config.privacy_level, error_text(error))
        if isinstance(error, Permanent):
            return await self._fail(ex, message, retryable=False)
        if isinstance(error, Retryable):
            delay = error.retry_after if error.retry_after is not None else None
            return await self._fail(ex, message, retryable=True, delay=delay)
        log.error(
            "run.raised",
            error_type=type(error).__name__,
            exc=keep_error(self.config.privacy_level, _format_exception(error)),
            **self._fields(ex.run),
        )
        return await self._fail(ex, message, retryable=True)

    async def _durable(
        self, ex: Execution, verb: str, call: Callable[[], Awaitable[T]]
    ) -> T | None:
        """One settle write, retried while the database is away.

        In the daemon (``settle_timeout_seconds`` None) until the database decides it, applied or
        fenced off: the execution stays in flight meanwhile, so the heartbeat renews its
        lease as soon as the database answers again, and the reaper waits one lease grace
        after an outage before it reaps. A completion that happened during an outage is
        then kept, not turned into a retry or a dead letter. Elsewhere (``runq work``, the
        sync transport: a caller is waiting) for at most one lease grace; after that the
        reaper settles the run."""
        timeout = self.config.settle_timeout_seconds
        deadline = None if timeout is None else time.monotonic() + timeout
        failures = 0
        while True:
            try:
                if not ex.shutdown_requested:
                    return await call()
                return await _finish_before_cancel(call)
            except TRANSIENT_ERRORS as e:
                failures += 1
                STORE_ERRORS.labels(service="executor").inc()
                if deadline is not None and time.monotonic() >= deadline:
                    log.error(
                        "run.settle_failed", verb=verb, error=error_text(e), **self._fields(ex.run)
                    )
                    return None
                await anyio.sleep(backoff_delay(failures, cap=2.0, base=0.1))
            except Exception as e:
                # Not the database being away: retrying would repeat it. The reaper settles
                # the run once its lease goes stale.
                STORE_ERRORS.labels(service="executor").inc()
                log.error(
                    "run.settle_failed",
                    verb=verb,
                    error=error_text(e),
                    exc=_format_exception(e),
                    **self._fields(ex.run),
                )
                return None

    def _fenced(self, ex: Execution, verb: str) -> Outcome:
        FENCED_WRITES.labels(verb=verb).inc()
        log.warning("run.write_fenced", verb=verb, **self._fields(ex.run))
        return Outcome("lost", applied=False)

    async def _completion(
        self, ex: Execution, value: Any, reason: TerminationReason
    ) -> Completion | Outcome:
        """The completion to write, or the failure when the answer cannot be stored."""
        if value is None:
            keep, stored = self.config.privacy_level != "none", None
        else:
            keep, stored = await keep_answer_async(
                self.config.privacy_level, value, self.config.redacted_max_chars
            )
            if keep and not _encodable(stored):
                # Checked here so one bad answer never fails the batch it would share.
                return await self._fail(ex, "answer cannot be encoded as JSON", retryable=False)
        completion = Completion(
            run_id=ex.run.id,
            attempt=ex.run.attempt,
            answer=stored if keep else None,
            keep_answer=keep,
            termination_reason=reason,
        )
        # The slot is free once the handler is done: the next claim overlaps this write
        # (the run stays running and fenced until the write lands).
        self.inflight.hand_in(ex)
        if self.on_finished is not None:
            self.on_finished()
        return completion

    async def _complete(self, ex: Execution, value: Any, reason: TerminationReason) -> Outcome:
        completion = await self._completion(ex, value, reason)
        if isinstance(completion, Outcome):
            return completion
        applied = await self._durable(ex, "complete", lambda: self.completer.complete(completion))
        return self._written(ex, reason, applied)

    async def _hand_in(
        self, ex: Execution, value: Any, reason: TerminationReason
    ) -> Outcome | None:
        """Give the completion to the batching completer and return None: no task waits for
        the write; ``_on_written`` finishes the run once the batch is decided."""
        completion = await self._completion(ex, value, reason)
        if isinstance(completion, Outcome):
            return completion
        self.completer.hand_in(completion, functools.partial(self._on_written, ex, reason))
        return None

    def _on_written(self, ex: Execution, reason: TerminationReason, result: WriteResult) -> None:
        if isinstance(result, BaseException):
            STORE_ERRORS.labels(service="executor").inc()
            log.error(
                "run.settle_failed",
                verb="complete",
                error=error_text(result),
                **self._fields(ex.run),
            )
            outcome = self._written(ex, reason, None)
        else:
            outcome = self._written(ex, reason, result)
        self._release(ex)
        self._finished(ex, outcome)

    def _written(self, ex: Execution, reason: TerminationReason, applied: bool | None) -> Outcome:
        if applied is None:
            return Outcome("unsettled", applied=False)
        if not applied:
            return self._fenced(ex, "complete")
        return Outcome("completed", reason.value)

    async def _fail(
        self, ex: Execution, error: str, *, retryable: bool, delay: float | None = None
    ) -> Outcome:
        run = ex.run
        if delay is None:
            base = self.config.retry_delay_seconds
            delay = retry_delay(run.attempt, base, random.random()) if retryable else 0.0
        result = await self._durable(
            ex,
            "fail",
            lambda: self.store.fail(
                self.worker_id,
                ex.lease,
                error=error,
                retryable=retryable,
                retry_in_seconds=max(delay or 0.0, 0.0),
            ),
        )
        if result is None:
            return Outcome("unsettled", applied=False, error=error)
        if result is FailOutcome.FENCED_OFF:
            return self._fenced(ex, "fail")
        # The error text stays out of INFO lines: it may quote the payload.
        log.info(
            "run.failed", retry_scheduled=result is FailOutcome.RETRY_SCHEDULED, **self._fields(run)
        )
        log.debug("run.failed_error", error=error, run_id=run.id)
        if result is FailOutcome.RETRY_SCHEDULED:
            return Outcome("retried", error=error)
        reason = (
            TerminationReason.RETRIES_EXHAUSTED if retryable else TerminationReason.NOT_RETRYABLE
        )
        return Outcome("failed", reason.value, error=error)

    async def _pause(self, ex: Execution, request: PauseRequested) -> Outcome:
        if not _encodable(request.state):
            return await self._fail(ex, "pause state cannot be encoded as JSON", retryable=False)
        applied = await self._durable(
            ex,
            "pause",
            lambda: self.store.pause(
                self.worker_id, ex.lease, reason=request.pause_reason, state=request.state
            ),
        )
        if applied is None:
            return Outcome("unsettled", applied=False)
        if not applied:
            return self._fenced(ex, "pause")
        return Outcome("paused")

    async def _settle_cancelled(self, ex: Execution) -> Outcome:
        applied = await self._durable(
            ex, "settle_cancelled", lambda: self.store.settle_cancelled(self.worker_id, ex.lease)
        )
        if applied is None:
            return Outcome("unsettled", applied=False)
        if not applied:
            return self._fenced(ex, "settle_cancelled")
        return Outcome("cancelled", TerminationReason.CANCELLED.value)


async def _finish_before_cancel(call: Callable[[], Awaitable[T]]) -> T:
    """Await a settle write that a cancel must not cut off halfway (the drain's stragglers):
    a cancel arriving meanwhile is raised once the write has landed."""
    write = asyncio.ensure_future(call())
    try:
        return await asyncio.shield(write)
    except asyncio.CancelledError:
        await asyncio.wait([write])
        raise


def _encodable(value: Any) -> bool:
    try:
        msgspec.json.encode(value)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return False
    return True


def _format_exception(error: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(error)).rstrip()
