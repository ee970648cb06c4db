"""Listings of runs: the filter every listing takes, the (created_at, id) keyset cursor,
and the pages the store returns. Shared by the store, the HTTP API, the CLI and the console,
so one rule decides which runs a page holds and how the next page is found."""

from __future__ import annotations

import base64
import math
from typing import TypedDict

import msgspec

from runq.model import Run, Status


class Page(msgspec.Struct, kw_only=True):
    data: list[Run]
    page: int
    limit: int
    total_count: int
    #: The cursor of the page after this one, when the listing is ordered by
    #: ``created_at`` and more rows follow; None otherwise.
    next_cursor: str | None = None

    @property
    def total_pages(self) -> int:
        return (self.total_count + self.limit - 1) // self.limit if self.total_count else 0


#: ``sort_by`` values the listing accepts; anything else is ignored, never interpolated.
SORTABLE_FIELDS: frozenset[str] = frozenset(
    {
        "created_at",
        "updated_at",
        "completed_at",
        "status",
        "attempt",
        "component_type",
        "component_id",
        "user_id",
        "available_at",
        "priority",
    }
)
DEFAULT_SORT_BY = "created_at"


class RunFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which runs a listing returns; every field narrows it, None or empty matches all."""

    statuses: tuple[Status, ...] = ()
    #: ``type/id``, ``type/*``, a glob with ``*`` in the id, or ``*`` (see ``[limits]``).
    component: str | None = None
    session_id: str | None = None
    user_id: str | None = None
    deployment_id: str | None = None
    #: ``created_after <= created_at < created_before`` (epoch seconds).
    created_after: float | None = None
    created_before: float | None = None
    #: Only this user's own runs: ``user_id`` equal and not submitted by a service account
    #: (the visibility rule of ``GET /runs`` for a caller who is neither admin nor approver).
    owner: str | None = None


#: The filter that matches every run (a shared default: RunFilter is frozen).
ALL_RUNS = RunFilter()


class RunCursor(msgspec.Struct, frozen=True, array_like=True):
    """Where a page of a ``created_at`` listing ended: the last row's (created_at, id).

    Keyset paging: the next page holds the rows strictly after this pair in the listing's
    order, so rows inserted meanwhile neither shift a page nor repeat one.
    """

    created_at: float
    id: str

    def encode(self) -> str:
        """Opaque to clients: base64url of the JSON pair, without padding."""
        return base64.urlsafe_b64encode(_cursor_encoder.encode(self)).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> RunCursor:
        """The cursor ``encode`` gave out; ValueError for anything else."""
        if not text or len(text) > MAX_CURSOR_CHARS:
            raise ValueError("cursor is empty or too long")
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            cursor = _cursor_decoder.decode(raw)
        except (ValueError, msgspec.DecodeError) as e:
            raise ValueError("cursor is not one this server gave out") from e
        if not math.isfinite(cursor.created_at) or not cursor.id:
            raise ValueError("cursor is not one this server gave out")
        return cursor

    @classmethod
    def of(cls, run: Run) -> RunCursor:
        return cls(run.created_at, run.id)


class RunList(msgspec.Struct, kw_only=True):
    """One page of ``Store.list_runs``: newest first, and the cursor of the next page."""

    data: list[Run]
    next_cursor: str | None = None


#: Longest cursor text accepted (a float and an id of at most 200 characters, as UTF-8).
MAX_CURSOR_CHARS = 1200
_cursor_encoder = msgspec.json.Encoder()
_cursor_decoder = msgspec.json.Decoder(RunCursor)


class JobListing(TypedDict, total=False):
    """The arguments of a paged listing of runs (``list_jobs``), written once: the store,
    its engines and the operator's side all take them as ``**listing``. Left out:
    page 1, 20 runs, ``created_at`` descending, every run, no cursor."""

    page: int
    limit: int
    #: A field of ``SORTABLE_FIELDS``; anything else sorts by ``created_at``.
    sort_by: str
    sort_order: str
    where: RunFilter
    #: Keyset paging from a cursor (with ``sort_by="created_at"`` and page 1).
    after: RunCursor | None
