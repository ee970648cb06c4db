"""``RunContext``: what a handler gets besides its payload.

    async def summarize(ctx: RunContext, payload: dict) -> dict:
        for chunk in payload["chunks"]:
            await ctx.checkpoint()            # renews the lease; raises on cancel/lost lease
            ...
        async with ctx.non_idempotent():      # a write that must never repeat
            await send_mail(...)
        await ctx.record_usage(tokens=812, cost=0.004)
        return {"summary": ...}

``checkpoint()``, ``pause()`` and ``stop_for_budget()`` raise subclasses of
``runq.errors.RunInterrupted``, which are ``BaseException``s: a handler's
``except Exception`` cannot swallow them by accident.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import anyio.from_thread

from runq.errors import BudgetExhausted, PauseRequested
from runq.model import Actor, Resume, clean_pause_summary

if TYPE_CHECKING:
    from runq.limits.budget import BudgetLeft


class ExecutionHooks(Protocol):
    """What the executor provides to a context (``runq.worker.executor.Execution``)."""

    async def checkpoint(self) -> None: ...

    async def set_non_idempotent(self, inside: bool) -> None: ...

    async def record_usage(self, tokens: int, cost: float) -> None: ...

    async def budget_left(self) -> BudgetLeft | None: ...

    def renew_lease_soon(self) -> None: ...

    async def emit(self, kind: str, data: Any) -> None: ...


class RunContext:
    """One execution of one run, as its handler sees it."""

    def __init__(
        self,
        *,
        run_id: str,
        attempt: int,
        component_type: str,
        component_id: str,
        actor: Actor,
        session_id: str | None,
        configuration: str | None,
        resume: Resume | None,
        payload: Any,
        hooks: ExecutionHooks,
    ) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.component_type = component_type
        self.component_id = component_id
        self.actor = actor
        self.session_id = session_id
        self.configuration = configuration
        #: On a continued run: the state given to ``pause()`` and the operator's decision.
        self.resume = resume
        self.payload = payload
        self._hooks = hooks

    def __repr__(self) -> str:
        # Never the payload: contexts end up in tracebacks and logs.
        return f"RunContext(run_id={self.run_id!r}, attempt={self.attempt})"

    async def checkpoint(self) -> None:
        """Renew the lease (throttled to about once a second) and stop here when the run
        was cancelled (``RunCancelled``) or this worker lost it (``LeaseLost``)."""
        await self._hooks.checkpoint()

    def checkpoint_sync(self) -> None:
        """``checkpoint()`` for a plain (threaded) handler."""
        anyio.from_thread.run(self._hooks.checkpoint)

    @asynccontextmanager
    async def non_idempotent(self) -> AsyncIterator[None]:
        """Mark a section whose writes must not repeat. If the lease is lost inside it, the
        reaper dead-letters the run instead of retrying it. An exception that escapes the
        section leaves the mark, so that failure is not retried either (the write may have
        happened)."""
        await self._hooks.set_non_idempotent(True)
        yield
        await self._hooks.set_non_idempotent(False)

    async def emit(self, kind: str, data: Any = None) -> None:
        """Append an event to the run's log (``progress``, ``step``, ``delta``, ``log`` or any
        short lower-case name; the lifecycle names are runq's). Written in batches behind
        the handler and fenced: after a lost lease nothing more is written. ``data`` must
        encode as JSON (at most 64 KiB); a bad kind or data raises ``InvalidPayload``."""
        await self._hooks.emit(kind, data)

    def emit_sync(self, kind: str, data: Any = None) -> None:
        """``emit()`` for a plain (threaded) handler."""
        anyio.from_thread.run(self._hooks.emit, kind, data)

    async def pause(
        self, reason: str, state: Any = None, *, summary: str | None = None
    ) -> NoReturn:
        """End this execution; the run becomes ``paused`` with ``state`` sealed until an
        operator continues it (``ctx.resume`` then holds state and decision). Never returns.

        ``summary``: one short text saying what the approver is asked to decide. Approvers
        read it although they may not open the run, and it is stored in clear (like
        ``reason``): never put secrets or payload data in it. Control characters are
        stripped and it is cut at ``MAX_PAUSE_SUMMARY_CHARS`` (500)."""
        raise PauseRequested(reason, state, clean_pause_summary(summary))

    async def record_usage(self, tokens: int = 0, cost: float = 0.0) -> None:
        """Add tokens and cost to the run and to every budget counter that applies."""
        await self._hooks.record_usage(tokens, cost)

    async def budget_left(self) -> BudgetLeft | None:
        """What is left under the tightest budget limit for this run's user/configuration."""
        return await self._hooks.budget_left()

    def stop_for_budget(self, partial_answer: Any = None) -> NoReturn:
        """Complete now with ``budget_exhausted`` and the answer so far."""
        raise BudgetExhausted(partial_answer)

    def renew_lease_soon(self) -> None:
        """Ask for a lease renewal now, before a long call that cannot checkpoint."""
        self._hooks.renew_lease_soon()
