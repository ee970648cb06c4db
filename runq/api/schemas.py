"""Request and response bodies of the HTTP API, as msgspec Structs.

Litestar decodes and validates request bodies against these types and generates the
OpenAPI document from them, so the constraints below *are* the API's input rules: no
handler parses JSON by hand. Text fields refuse control characters because PostgreSQL
``text`` cannot hold NUL and such values are never meaningful identifiers.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from runq.listing import Page
from runq.model import Status, TerminationReason
from runq.ops.views import OPERATOR_VIEW, PauseOut, RunView

#: Longest ``Idempotency-Key`` accepted; a longer one is answered 422 (issue #1).
MAX_IDEMPOTENCY_KEY_CHARS = 512
#: Upper bounds that keep every accepted number inside a 32-bit column and a sane range.
MAX_ATTEMPTS_LIMIT = 1000
PRIORITY_LIMIT = 1_000_000
MAX_DELAY_SECONDS = 366 * 86400.0
#: Highest page number; keeps ``(page - 1) * limit`` well inside a 64-bit OFFSET.
MAX_PAGE = 1_000_000_000

_PRINTABLE = r"^[^\x00-\x1f\x7f]+$"
#: Ids are UUIDv7 here, but imports may set their own; refuse only what no id can contain
#: (PostgreSQL text cannot hold NUL), so a crafted path is a 404, never a database error.
_PLAUSIBLE_ID = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")
#: An identifier chosen by the caller (component id, session, configuration).
Name = Annotated[str, Meta(min_length=1, max_length=200, pattern=_PRINTABLE)]
#: ``deployment_id``: "" means "none", like the config key.
DeploymentName = Annotated[str, Meta(max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$")]
ComponentTypeName = Literal["agent", "team", "workflow", "task"]
SortOrder = Literal["asc", "desc"]


def is_plausible_id(run_id: str) -> bool:
    return _PLAUSIBLE_ID.match(run_id) is not None


class RunOptions(Struct, kw_only=True, forbid_unknown_fields=True):
    """What a submission says about its run, in ``POST /runs`` and in each item of
    ``POST /runs/batch``. Unknown fields are refused: a misspelt option must not be ignored."""

    component_type: ComponentTypeName
    component_id: Name
    payload: Any = None
    session_id: Name | None = None
    #: Budget scope ``configuration`` (``[[budget.limits]]``); optional.
    configuration: Name | None = None
    #: Default: ``[queue] max_attempts``.
    max_attempts: Annotated[int, Meta(ge=1, le=MAX_ATTEMPTS_LIMIT)] | None = None
    #: Default: the accepting replica's ``[queue] deployment_id``.
    deployment_id: DeploymentName | None = None
    #: Lower runs first. Absent or null: 0, moved into ``[http] user_priority_range`` for a
    #: caller without the admin scope (who may only ask for priorities in that range).
    priority: Annotated[int, Meta(ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)] | None = None
    delay_seconds: Annotated[float, Meta(ge=0, le=MAX_DELAY_SECONDS)] = 0.0
    #: Runs sharing a key count together against ``[limits] max_running_per_key``.
    concurrency_key: Name | None = None
    #: Unique runs: while a run of this component with this key counts (its status is in
    #: ``unique_states``, default all, and it is not final or was created within
    #: ``unique_for_seconds``), the answer is that run with ``created: false``, whoever
    #: submitted it.
    unique_key: Annotated[str, Meta(min_length=1, max_length=200)] | None = None
    unique_for_seconds: Annotated[float, Meta(ge=0, le=366 * 86400)] | None = None
    unique_states: Annotated[list[Status], Meta(min_length=1, max_length=6)] | None = None
    #: This run's handler deadline instead of ``[queue] timeout_seconds``; at most
    #: ``[queue] max_timeout_seconds`` (400 above it).
    timeout_seconds: Annotated[float, Meta(gt=0, le=366 * 86400)] | None = None


class RunSubmission(RunOptions, kw_only=True, forbid_unknown_fields=True):
    """``POST /runs``."""

    #: False: follow the routing rule; on a ``sync`` route the run executes in the request.
    background: bool = True


#: Most runs one ``POST /runs/batch`` may carry: bounds one request's transaction.
MAX_BATCH_RUNS = 1000


class BatchItem(RunOptions, kw_only=True, forbid_unknown_fields=True):
    """One run of ``POST /runs/batch``; ``idempotency_key`` as the header of ``POST /runs``."""

    idempotency_key: (
        Annotated[str, Meta(min_length=1, max_length=MAX_IDEMPOTENCY_KEY_CHARS)] | None
    ) = None


class BatchSubmission(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /runs/batch``: up to ``MAX_BATCH_RUNS`` runs, stored all or none."""

    items: Annotated[list[BatchItem], Meta(min_length=1, max_length=MAX_BATCH_RUNS)]


class ContinueRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /runs/{id}/continue``: the decision handed to the run as ``ctx.resume.decision``."""

    decision: Any = None


class SubmitAccepted(Struct, kw_only=True):
    """``POST /runs``: 202 for a queued run; 200 with the outcome when it ran in the request."""

    run_id: str
    session_id: str | None
    status: Status
    #: Only on 200 (executed inside the request), and only when the answer was kept.
    answer: Any | UnsetType = UNSET
    error: str | UnsetType | None = UNSET
    termination_reason: TerminationReason | UnsetType | None = UNSET
    #: False when an existing run was returned (idempotency key or unique key).
    created: bool = True


class BatchAccepted(Struct, kw_only=True):
    """``POST /runs/batch``: one answer per item, in the order given."""

    items: list[SubmitAccepted]


#: ``GET /runs/{id}`` and the other ``/runs`` answers: the owner's view of a run
#: (``runq.ops.views``; the name the HTTP client has always decoded into).
RunOut = RunView


class RunsPage(Struct, kw_only=True):
    """``GET /runs``: runs the caller may see, newest first. ``next_cursor`` continues the
    listing (pass it as ``cursor``); null on the last page."""

    data: list[RunView]
    next_cursor: str | None


class PageMeta(Struct, kw_only=True):
    page: int
    limit: int
    total_count: int
    total_pages: int


class JobsPage(Struct, kw_only=True):
    """``GET /queue/jobs``: one page of jobs as operators see them, and where it sits."""

    data: list[RunView]
    meta: PageMeta
    #: Sorted by ``created_at`` and more jobs follow: pass it as ``cursor`` for the next page.
    next_cursor: str | None = None

    @classmethod
    def from_page(cls, page: Page) -> JobsPage:
        meta = PageMeta(
            page=page.page,
            limit=page.limit,
            total_count=page.total_count,
            total_pages=page.total_pages,
        )
        data = [RunView.of(run, OPERATOR_VIEW) for run in page.data]
        return cls(data=data, meta=meta, next_cursor=page.next_cursor)


class ErrorBody(Struct, kw_only=True):
    """Every error answer: a stable machine-readable ``error`` and a human ``detail``."""

    error: str
    detail: str


class HealthOut(Struct, kw_only=True):
    status: Literal["ok", "ready"]
    detail: str = ""


class ReadyOut(HealthOut, kw_only=True):
    #: The database this replica writes to: ``host:port`` of the PostgreSQL primary it
    #: reached last (it follows a failover), or ``sqlite``.
    database: str = ""


__all__ = [
    "MAX_BATCH_RUNS",
    "MAX_IDEMPOTENCY_KEY_CHARS",
    "MAX_PAGE",
    "BatchAccepted",
    "BatchItem",
    "BatchSubmission",
    "ComponentTypeName",
    "ContinueRequest",
    "ErrorBody",
    "HealthOut",
    "JobsPage",
    "PageMeta",
    "PauseOut",
    "ReadyOut",
    "RunOptions",
    "RunOut",
    "RunSubmission",
    "RunView",
    "RunsPage",
    "SortOrder",
    "Status",
    "SubmitAccepted",
    "is_plausible_id",
]
