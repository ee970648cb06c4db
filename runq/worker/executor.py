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
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from runq.components import ComponentRegistry, Handler, is_async_handler
from runq.context import RunContext
from runq.errors import RunInterrupted
from runq.log import get_logger
from runq.metrics import QUEUE_WAIT
from runq.model import Run, TerminationReason
from runq.store.base import Store
from runq.worker.completer import Completer
from runq.worker.events import EventBatcher
from runq.worker.execution import (
    Answer,
    Deadline,
    Execution,
    ExecutionResult,
    ExecutorConfig,
    Interrupt,
    Interrupted,
    Outcome,
    Raised,
    TimedOut,
    error_text,
    format_exception,
)
from runq.worker.inflight import InFlight
from runq.worker.settle import Settler

if TYPE_CHECKING:
    from runq.limits.budget import BudgetGate

__all__ = ["Execution", "Executor", "ExecutorConfig", "Outcome", "live_handler_threads"]

log = get_logger(__name__)

#: Checked before building the keyword arguments of a per-run log line: at thousands of
#: runs a second even building them showed in the profile.
_stdlib_log = logging.getLogger(__name__)

#: How often a cancelled or timed-out execution looks whether its handler thread returned.
THREAD_POLL_SECONDS = 0.05

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


class Executor(Settler):
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

    def admit(self, run: Run, *, waiting: bool = False) -> Execution:
        """Register a claimed run as in flight, synchronously: the claimer calls this before it
        starts the task, so the next free-slot count already includes the run. ``waiting``:
        claimed ahead of a free slot; ``InFlight.start`` gives it one later."""
        execution = Execution(run, self)
        self.inflight.add(execution, waiting=waiting)
        return execution

    def timeout_of(self, run: Run) -> float:
        """The handler deadline of ``run``: its own ``timeout_seconds`` when it was submitted
        with one (bounded by ``[queue] max_timeout_seconds`` then), else the configured one."""
        own = run.timeout_seconds
        return self.config.timeout_seconds if own is None else own

    def arm_deadline(self, executions: list[Execution]) -> None:
        """One handler deadline per distinct timeout among runs claimed together (from now):
        a batch of runs without their own timeout still shares one timer."""
        groups: dict[float, list[Execution]] = {}
        for execution in executions:
            groups.setdefault(self.timeout_of(execution.run), []).append(execution)
        for seconds, group in groups.items():
            deadline = Deadline(group, seconds)
            for execution in group:
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
            log.error("run.executor_error", exc=format_exception(e), **self._fields(run))
            outcome = Outcome("unsettled", applied=False, error=error_text(e))
        finally:
            if execution.events is not None:
                execution.events.abandon()
            if not pending:
                self._release(execution)
        if outcome is not None:
            self._finished(execution, outcome)
        return outcome

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
        if ex.events is not None and not isinstance(result, Answer):
            # Every event before the outcome, so the final one is last (an answer's
            # completion carries the unwritten ones itself: ``Settler._completion``).
            await ex.events.close()
        batching = hand_in and self.completer.running and not ex.shutdown_requested
        if batching and isinstance(result, Answer):
            return await self._hand_in(ex, result.value, TerminationReason.COMPLETED)
        outcome = await self._settle(ex, result)
        await self._trim_events(ex, outcome)
        return outcome

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

    async def _invoke(self, ex: Execution, handler: Handler) -> ExecutionResult:
        ctx = self._context(ex)
        task = asyncio.current_task()
        result: ExecutionResult
        try:
            if ex.interrupted is not None or ex.timed_out:
                result = Raised(RuntimeError("handler was not started"))
            else:
                ex.calling = task
                if self._is_async(handler):
                    result = Answer(await handler(ctx, ctx.payload))
                else:
                    result = Answer(await self._call_in_thread(handler, ctx, ex))
        except asyncio.CancelledError:
            if not ex.cancel_sent:
                raise  # not ours: this process is being cancelled
            result = Raised(RuntimeError("handler was cancelled"))
        except Exception as e:
            result = Raised(e)
        except RunInterrupted as e:
            result = Raised(e)
        finally:
            ex.calling = None
            self._handler_ended(ex)
        if ex.cancel_sent and task is not None and task.uncancel() > 0:
            # Our interrupt was taken; a cancel of the task itself came too: let it go on.
            raise asyncio.CancelledError
        if ex.interrupted is not None:
            result = Interrupted(ex.interrupted)
        elif ex.timed_out and not isinstance(result, Answer):
            result = TimedOut(self.timeout_of(ex.run))
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

    async def _wait_for_thread(self, ex: Execution, result: ExecutionResult) -> None:
        """Hold slot and lease until an interrupted plain function returns, so a retry or
        requeue never runs beside it. Not on a lost lease (it is gone) nor in the drain."""
        done = ex.thread_done
        if done is None or done.is_set():
            return
        if isinstance(result, Interrupted) and result.reason is not Interrupt.CANCELLED:
            return
        log.info("run.waiting_for_thread", **self._fields(ex.run))
        while not done.is_set() and not ex.shutdown_requested:
            if ex.interrupted is Interrupt.LEASE_LOST:
                return
            await anyio.sleep(THREAD_POLL_SECONDS)
