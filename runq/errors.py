"""The errors runq raises. The HTTP layer maps each family to one status code."""

from __future__ import annotations


class RunqError(Exception):
    """Base of every error runq raises on purpose."""


class ConfigError(RunqError):
    """A configuration value is missing, malformed or out of range.

    ``key`` is the dotted name of the offending key (``queue.lock_grace_seconds``)
    so the operator knows exactly what to fix.
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}")


class BadRequest(RunqError):
    """The caller asked for something malformed (HTTP 400)."""


class InvalidPayload(BadRequest, ValueError):
    """A payload that cannot be encoded as JSON; nothing was stored."""


class UnknownComponent(BadRequest):
    """A submission named a component no handler is configured for."""


class NotFound(RunqError):
    """No run with that id (or none the caller may see) (HTTP 404)."""


class Conflict(RunqError):
    """The run exists but is in a state that refuses the request (HTTP 409)."""


class InvalidTransition(BadRequest):
    """The requested transition is not allowed from the run's status (HTTP 400)."""


class IdempotencyConflict(Conflict):
    """An idempotency key was reused for a different component (HTTP 409)."""


class QueueFull(RunqError):
    """``max_queue_depth`` queued runs exist already (HTTP 429)."""


class StoreUnavailable(RunqError):
    """The database cannot be reached or refused the write (HTTP 503)."""


class StoreContention(StoreUnavailable):
    """The database aborted the write to break a lock cycle or a serialization conflict
    (PostgreSQL SQLSTATE 40P01, 40001), or a lock wait ran out (55P03), and it kept
    happening after the store's own tries: nothing was written, and the same write may
    be tried again. The database answered, so this is no outage, but every caller that
    retries ``StoreUnavailable`` retries this too (HTTP 503)."""


class SealError(RunqError):
    """A sealed value failed to open, or no key can seal. Never a cleartext fallback."""


class Permanent(RunqError):
    """Raised by a handler: fail the run now, without retry."""


class Retryable(RunqError):
    """Raised by a handler: fail this attempt, retry no earlier than ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class RunInterrupted(BaseException):
    """Raised inside a handler when its execution must stop: cancelled or lease lost.

    A BaseException, like ``asyncio.CancelledError``, so a handler's ``except Exception``
    cannot swallow it by accident.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class RunCancelled(RunInterrupted):
    """The run was cancelled; the executor settles it ``cancelled``."""

    def __init__(self) -> None:
        super().__init__("cancelled")


class LeaseLost(RunInterrupted):
    """This worker no longer holds the run; every further write would be fenced off."""

    def __init__(self) -> None:
        super().__init__("lease lost")


class PauseRequested(RunInterrupted):
    """Raised by ``ctx.pause()``; ends the execution, the run becomes ``paused``."""

    def __init__(self, reason: str, state: object, summary: str | None = None) -> None:
        self.pause_reason = reason
        self.state = state
        #: What the approver is asked to decide, already cleaned (``clean_pause_summary``).
        self.summary = summary
        super().__init__(f"paused: {reason}")


class BudgetExhausted(RunInterrupted):
    """Raised by ``ctx.stop_for_budget()``: complete ``budget_exhausted`` with the answer so far."""

    def __init__(self, partial_answer: object = None) -> None:
        self.partial_answer = partial_answer
        super().__init__("budget exhausted")
