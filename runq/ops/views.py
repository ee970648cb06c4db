"""One view of a run for every reader, with the fields each reader's role may see.

``RunView`` is what ``GET /runs`` and ``GET /runs/{id}`` answer, what ``/queue/jobs`` and
``runq jobs`` show, and what the console's run page lists. The run's state (the fields
every role sees) is always there; the rest is by role, and a field a role does not see is
*absent* from the JSON (``UNSET``), never null:

- ``Role.OWNER``, a caller looking at runs through ``/runs``: lifecycle details (cancel
  requested, deadline, first start, usage, the pause) and, when it may read the run's
  content, ``payload`` and ``answer``;
- ``Role.OPERATOR``, an admin on ``/queue``, the CLI or the console: the request
  (``payload``), the reason a queued run waits, and the sealed full error text.

A ``Selection`` is a role's field set. Narrowing or widening it per request
(``?fields=``, ``include=payload``) is a matter of ``Selection.only`` / ``including``
and a page's byte budget a matter of the caller measuring the views it encodes: the
struct and ``RunView.of`` stay as they are.

This module imports nothing but the model, so the HTTP client decodes with it too.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from runq.model import Run, Status, TerminationReason, WaitReason


class PauseOut(msgspec.Struct, kw_only=True):
    """A paused run's question to its approver. ``summary`` is the handler's short text
    (``ctx.pause(summary=...)``), stored in clear and shown to approvers."""

    reason: str | None
    summary: str | None


class RunView(msgspec.Struct, kw_only=True):
    """A run as a reader sees it. The fields up to ``concurrency_key`` are the run's state,
    seen by every role; the ones after it are absent unless the reader's role (and, for
    ``payload`` and ``answer``, its right to the content) shows them."""

    id: str
    component_type: str
    component_id: str
    session_id: str | None
    user_id: str | None
    status: Status
    attempt: int
    max_attempts: int
    error: str | None
    locked_by: str | None
    locked_at: float | None
    idempotency_key: str | None
    payload: Any | UnsetType = UNSET
    created_at: float
    updated_at: float
    completed_at: float | None
    deployment_id: str | None
    available_at: float
    priority: int
    termination_reason: TerminationReason | None
    pause_reason: str | None
    #: A queued run's reason for waiting, when it has one.
    waiting: WaitReason | UnsetType | None = UNSET
    concurrency_key: str | None = None
    #: The handler's full error text, sealed at rest: operators only (``error`` is what
    #: ``[privacy] level`` keeps).
    error_detail: str | UnsetType | None = UNSET
    cancel_requested: bool | UnsetType = UNSET
    answer: Any | UnsetType = UNSET
    timeout_seconds: float | UnsetType | None = UNSET
    #: When the first attempt started (None while it never ran).
    started_at: float | UnsetType | None = UNSET
    #: Usage the handler recorded (``ctx.record_usage``), over every attempt.
    tokens: int | UnsetType = UNSET
    cost: float | UnsetType = UNSET
    #: Only on a paused run: why, and what the approver is asked to decide.
    pause: PauseOut | UnsetType | None = UNSET

    @classmethod
    def of(
        cls,
        run: Run,
        selection: Selection,
        *,
        waiting: WaitReason | None = None,
        error_detail: str | None = None,
    ) -> RunView:
        """The view of ``run`` with the fields of ``selection``; ``waiting`` and
        ``error_detail`` come from reads of their own (``Operations``)."""
        view = cls(
            id=run.id,
            component_type=run.component_type,
            component_id=run.component_id,
            session_id=run.session_id,
            user_id=run.user_id,
            status=run.status,
            attempt=run.attempt,
            max_attempts=run.max_attempts,
            error=run.error,
            locked_by=run.locked_by,
            locked_at=run.locked_at,
            idempotency_key=run.idempotency_key,
            created_at=run.created_at,
            updated_at=run.updated_at,
            completed_at=run.completed_at,
            deployment_id=run.deployment_id,
            available_at=run.available_at,
            priority=run.priority,
            termination_reason=run.termination_reason,
            pause_reason=run.pause_reason,
            concurrency_key=run.concurrency_key,
        )
        shown = selection.fields
        if "payload" in shown:
            view.payload = run.payload
        if "answer" in shown:
            view.answer = run.answer
        if "waiting" in shown:
            view.waiting = waiting
        if "error_detail" in shown:
            view.error_detail = error_detail
        if "cancel_requested" in shown:
            view.cancel_requested = run.cancel_requested
        if "timeout_seconds" in shown:
            view.timeout_seconds = run.timeout_seconds
        if "started_at" in shown:
            view.started_at = run.started_at
        if "tokens" in shown:
            view.tokens = run.tokens
        if "cost" in shown:
            view.cost = run.cost
        if "pause" in shown:
            view.pause = (
                PauseOut(reason=run.pause_reason, summary=run.pause_summary)
                if run.status is Status.PAUSED
                else None
            )
        return view


class Role(enum.Enum):
    """Who reads: the owner side of ``/runs``, or an operator (``/queue``, CLI, console)."""

    OWNER = "owner"
    OPERATOR = "operator"


#: The fields shown by role beyond the run's state, and those shown only with the content.
ROLE_FIELDS: dict[Role, frozenset[str]] = {
    Role.OWNER: frozenset(
        {"cancel_requested", "waiting", "timeout_seconds", "started_at", "tokens", "cost", "pause"}
    ),
    Role.OPERATOR: frozenset({"payload", "waiting", "error_detail"}),
}
CONTENT_FIELDS = frozenset({"payload", "answer"})


class Selection(msgspec.Struct, frozen=True):
    """The optional fields a view shows (the run's state is always shown)."""

    role: Role
    fields: frozenset[str]

    @classmethod
    def for_role(cls, role: Role, *, content: bool = False) -> Selection:
        """A role's fields; ``content``: the owner side may read the run's payload and
        answer (an approver of someone else's run may not)."""
        fields = ROLE_FIELDS[role] | (CONTENT_FIELDS if content else frozenset())
        return cls(role, fields)

    def only(self, names: frozenset[str]) -> Selection:
        """This selection cut to ``names`` (a reader asking for fewer fields)."""
        return Selection(self.role, self.fields & names)

    def including(self, names: frozenset[str], allowed: frozenset[str]) -> Selection:
        """This selection with ``names`` added, as far as ``allowed`` lets the reader."""
        return Selection(self.role, self.fields | (names & allowed))


OWNER_VIEW = Selection.for_role(Role.OWNER)
OWNER_CONTENT_VIEW = Selection.for_role(Role.OWNER, content=True)
OPERATOR_VIEW = Selection.for_role(Role.OPERATOR)
