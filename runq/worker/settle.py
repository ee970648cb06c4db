"""The executor's settle path: from a handler's result to the one fenced write that
records it (complete, fail with backoff, pause, cancelled), then the event trim.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.lowlevel
import msgspec

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
from runq.loops import UNAVAILABLE_ERRORS, WRITE_BACKOFF, Retry
from runq.metrics import FENCED_WRITES, LEASES_LOST, RUN_DURATION, RUNS_FINISHED, STORE_ERRORS
from runq.model import Completion, FailOutcome, Run, TerminationReason, retry_delay
from runq.privacy import keep_answer_async, keep_error
from runq.store.base import Store
from runq.worker.completer import Completer, WriteResult
from runq.worker.execution import (
    SHUTDOWN_ERROR,
    Answer,
    Execution,
    ExecutionResult,
    ExecutorConfig,
    Interrupt,
    Interrupted,
    Outcome,
    TimedOut,
    error_text,
    format_exception,
)
from runq.worker.inflight import InFlight

if TYPE_CHECKING:
    from runq.limits.budget import BudgetGate

log = get_logger("runq.worker.executor")  # one logger name for the whole executor

#: Checked before building the keyword arguments of a per-run log line: at thousands of
#: runs a second even building them showed in the profile.
_stdlib_log = logging.getLogger("runq.worker.executor")

T = TypeVar("T")

#: Outcomes after whose write a run's events are trimmed to the privacy level (a
#: completion trims in its own write).
_TRIMMED_AFTER = frozenset({"failed", "cancelled"})


@functools.cache
def _run_duration(component_type: str, outcome: str) -> Any:
    return RUN_DURATION.labels(component_type=component_type, outcome=outcome)


@functools.cache
def _runs_finished(outcome: str, termination_reason: str) -> Any:
    return RUNS_FINISHED.labels(outcome=outcome, termination_reason=termination_reason)


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


class Settler:
    """The settle path of ``Executor``: one fenced write per outcome (complete, fail, pause,
    cancelled), the metrics and log line of a finished run, and the event trim after it."""

    store: Store
    config: ExecutorConfig
    worker_id: str
    inflight: InFlight
    completer: Completer
    budget: BudgetGate | None
    on_finished: Callable[[], None] | None

    def _fields(self, run: Run) -> dict[str, Any]:
        return {"run_id": run.id, "attempt": run.attempt, "worker_id": self.worker_id}

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

    def _must_trim(self, ex: Execution) -> bool:
        """True when a settled run's events must be cut to ``[privacy] level``: handler data
        in this attempt or an earlier one, or lifecycle details the level drops (``none``).
        A completion trims in its own write (``Completion.trim_level``), so it still
        batches; the other outcomes trim after their write."""
        level = self.config.privacy_level
        if level == "full":
            return False
        emitted = ex.events is not None and ex.events.wrote_data
        return emitted or ex.run.attempt > 1 or level == "none"

    async def _trim_events(self, ex: Execution, outcome: Outcome) -> None:
        """Cut a failed or cancelled run's events to ``[privacy] level`` (see
        ``_must_trim``; a completion did it in its own write)."""
        if outcome.kind not in _TRIMMED_AFTER or not outcome.applied or not self._must_trim(ex):
            return
        try:
            await self.store.trim_events(
                ex.run.id, self.config.privacy_level, self.config.redacted_max_chars
            )
        except Exception as e:  # the run is settled; its events wait for the next settle
            log.warning("run.trim_events_failed", error=error_text(e), **self._fields(ex.run))

    async def _settle(self, ex: Execution, result: ExecutionResult) -> Outcome:
        if ex.shutdown_requested and not isinstance(result, Answer):
            return await self._fail(ex, SHUTDOWN_ERROR, retryable=True, delay=0.0)
        if isinstance(result, Answer):
            return await self._complete(ex, result.value, TerminationReason.COMPLETED)
        if isinstance(result, TimedOut):
            return await self._fail(ex, f"timed out after {result.seconds:g} s", retryable=True)
        if isinstance(result, Interrupted):
            return await self._settle_interrupt(ex, result.reason)
        return await self._settle_raised(ex, result.error)

    async def _settle_interrupt(self, ex: Execution, reason: Interrupt) -> Outcome:
        if reason is Interrupt.CANCELLED:
            return await self._settle_cancelled(ex)
        if reason is Interrupt.SHUTDOWN:
            return await self._fail(ex, SHUTDOWN_ERROR, retryable=True, delay=0.0)
        LEASES_LOST.inc()
        log.warning(
            "run.lease_lost",
            reason="lease_lost",
            detail="the lease went to the reaper or another worker: this execution stops, "
            "and the run executes again unless it was settled",
            **self._fields(ex.run),
        )
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
        # A handler's message may quote the payload: ``error`` keeps what the privacy level
        # allows, and the whole message is sealed beside it for admins.
        full = error_text(error)
        message = keep_error(self.config.privacy_level, full)
        if isinstance(error, Permanent):
            return await self._fail(ex, message, retryable=False, detail=full)
        if isinstance(error, Retryable):
            delay = error.retry_after if error.retry_after is not None else None
            return await self._fail(ex, message, retryable=True, delay=delay, detail=full)
        log.error(
            "run.raised",
            error_type=type(error).__name__,
            exc=keep_error(self.config.privacy_level, format_exception(error)),
            **self._fields(ex.run),
        )
        return await self._fail(ex, message, retryable=True, detail=full)

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
        retry = Retry(WRITE_BACKOFF, metric="executor", event=None)
        while True:
            try:
                if not ex.shutdown_requested:
                    return await call()
                return await _finish_before_cancel(call)
            except UNAVAILABLE_ERRORS as e:
                delay = retry.failed(e)
                if deadline is not None and time.monotonic() >= deadline:
                    log.error(
                        "run.settle_failed", verb=verb, error=error_text(e), **self._fields(ex.run)
                    )
                    return None
                await anyio.sleep(delay)
            except Exception as e:
                # Not the database being away: retrying would repeat it. The reaper settles
                # the run once its lease goes stale.
                STORE_ERRORS.labels(service="executor").inc()
                log.error(
                    "run.settle_failed",
                    verb=verb,
                    error=error_text(e),
                    exc=format_exception(e),
                    **self._fields(ex.run),
                )
                return None

    def _fenced(self, ex: Execution, verb: str) -> Outcome:
        FENCED_WRITES.labels(verb=verb).inc()
        log.warning(
            "run.write_fenced",
            verb=verb,
            reason="lease_lost",
            detail="the run's outcome was discarded: its lease was lost before the write "
            "landed, so the run executes again unless it was settled",
            **self._fields(ex.run),
        )
        return Outcome("lost", applied=False)

    async def _completion(
        self, ex: Execution, value: Any, reason: TerminationReason
    ) -> Completion | Outcome:
        """The completion to write, or the failure when the answer cannot be stored."""
        if ex.run.resume is not None and not self.config.keep_answer_after_approval:
            # Continued after a pause: the answer is not kept (docs/privacy.md).
            keep, stored = False, None
        elif value is None:
            keep, stored = self.config.privacy_level != "none", None
        else:
            keep, stored = await keep_answer_async(
                self.config.privacy_level, value, self.config.redacted_max_chars
            )
            if keep and not _encodable(stored):
                # Checked here so one bad answer never fails the batch it would share.
                if ex.events is not None:
                    await ex.events.close()
                return await self._fail(ex, "answer cannot be encoded as JSON", retryable=False)
        # What the handler emitted last rides with the completion: one fenced write.
        events = await ex.events.take_rest() if ex.events is not None else ()
        completion = Completion(
            run_id=ex.run.id,
            attempt=ex.run.attempt,
            answer=stored if keep else None,
            keep_answer=keep,
            termination_reason=reason,
            events=events,
            trim_level=self.config.privacy_level if self._must_trim(ex) else None,
            redacted_max_chars=self.config.redacted_max_chars,
        )
        # The slot is free once the handler is done: the next claim overlaps this write
        # (the run stays running and fenced until the write lands).
        self.inflight.hand_in(ex, time.monotonic() - ex.started)
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
        self,
        ex: Execution,
        error: str,
        *,
        retryable: bool,
        delay: float | None = None,
        detail: str | None = None,
    ) -> Outcome:
        """Fail or retry the run with ``error``; ``detail`` is the handler's full message
        (sealed, admins only), None when ``error`` is runq's own text."""
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
                error_detail=detail,
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
                self.worker_id,
                ex.lease,
                reason=request.pause_reason,
                state=request.state,
                summary=request.summary,
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
