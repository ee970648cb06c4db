"""Every error the API answers, as JSON ``{"error": ..., "detail": ...}``.

One exception handler maps runq's error families (docs/INTERNALS.md), the API's own
refusals and Litestar's exceptions to a status code and a stable ``error`` word. Anything
else is a bug: it answers 500 and is logged *without its message*, because an exception
raised around a submission may carry the payload in its text, and payloads never reach logs.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException
from litestar.openapi.datastructures import ResponseSpec

from runq.api import SERVICES_STATE_KEY
from runq.api.auth import Forbidden, Unauthenticated
from runq.api.edge import HostNotAllowed, OriginNotAllowed, UnsupportedMediaType
from runq.api.schemas import ErrorBody
from runq.errors import (
    BadRequest,
    Conflict,
    IdempotencyConflict,
    InvalidPayload,
    InvalidTransition,
    NotFound,
    QueueFull,
    RunqError,
    SealError,
    StoreUnavailable,
    UnknownComponent,
)

log = logging.getLogger("runq.api")

#: Answers the edge checks (``runq.api.edge``) can give on any operation.
EDGE_STATUSES = (415, 421)

#: Seconds a client should wait before retrying a 429 or a 503.
RETRY_AFTER_SECONDS = 5


class IdempotencyKeyInvalid(RunqError):
    """An ``Idempotency-Key`` header longer than the limit (HTTP 422)."""


class WorkerDisabled(RunqError):
    """``/queue`` on a replica with ``[queue] worker = false`` (HTTP 503)."""


class NotReady(RunqError):
    """``/readyz``: the database does not answer or migrations are not current (HTTP 503)."""


#: Most specific first: the first ``isinstance`` match decides.
_RUNQ_ERRORS: tuple[tuple[type[RunqError], int, str], ...] = (
    (HostNotAllowed, 421, "host_not_allowed"),
    (OriginNotAllowed, 403, "origin_not_allowed"),
    (UnsupportedMediaType, 415, "unsupported_media_type"),
    (Unauthenticated, 401, "unauthorized"),
    (Forbidden, 403, "forbidden"),
    (NotFound, 404, "not_found"),
    (IdempotencyConflict, 409, "idempotency_conflict"),
    (Conflict, 409, "conflict"),
    (IdempotencyKeyInvalid, 422, "invalid_idempotency_key"),
    (UnknownComponent, 400, "unknown_component"),
    (InvalidTransition, 400, "invalid_transition"),
    (InvalidPayload, 400, "invalid_payload"),
    (BadRequest, 400, "bad_request"),
    (QueueFull, 429, "queue_full"),
    (StoreUnavailable, 503, "store_unavailable"),
    (WorkerDisabled, 503, "worker_disabled"),
    (NotReady, 503, "not_ready"),
)

_HTTP_WORDS: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
    503: "unavailable",
}

_RETRY_AFTER_STATUSES = frozenset({429, 503})


def error_response(
    status: int, error: str, detail: str, headers: dict[str, str] | None = None
) -> Response[ErrorBody]:
    all_headers = dict(headers or {})
    if status in _RETRY_AFTER_STATUSES:
        all_headers.setdefault("Retry-After", str(RETRY_AFTER_SECONDS))
    if status == 401:
        all_headers.setdefault("WWW-Authenticate", 'Bearer realm="runq"')
    return Response(ErrorBody(error=error, detail=detail), status_code=status, headers=all_headers)


def handle_exception(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    """The app's only exception handler (registered for ``Exception``)."""
    if isinstance(exc, RunqError):
        return _runq_error(exc)
    if isinstance(exc, ValidationException):
        return error_response(400, "bad_request", validation_detail(exc))
    if isinstance(exc, HTTPException):
        word = _HTTP_WORDS.get(exc.status_code, "error")
        detail = _http_detail(request, exc)
        return error_response(exc.status_code, word, detail, dict(exc.headers or {}))
    _log_bug(request, exc)
    return error_response(500, "internal", "internal error; the server log has the details")


def _http_detail(request: Request[Any, Any, Any], exc: HTTPException) -> str:
    if isinstance(exc.__cause__, SerializationException):
        return f"the body is not valid JSON: {exc.detail}"
    if exc.status_code == 413:
        limit = request.app.state[SERVICES_STATE_KEY].config.http.max_body_bytes
        return f"the request body is larger than {limit} bytes ([http] max_body_bytes)"
    return str(exc.detail)


def runq_error_status(exc: RunqError) -> tuple[int, str] | None:
    """The HTTP status and error word for a runq error, or None for one with no mapping."""
    for family, status, word in _RUNQ_ERRORS:
        if isinstance(exc, family):
            return status, word
    return None


def _runq_error(exc: RunqError) -> Response[ErrorBody]:
    mapped = runq_error_status(exc)
    if mapped is not None:
        return error_response(mapped[0], mapped[1], str(exc))
    if isinstance(exc, SealError):
        # Names the run and column, never the value: safe to answer and to log.
        log.error("sealed value failed to open: %s", exc)
        return error_response(500, "seal_error", str(exc))
    log.error("unmapped runq error %s", type(exc).__name__)
    return error_response(500, "internal", "internal error; the server log has the details")


def validation_detail(exc: ValidationException) -> str:
    """``body.priority: Expected `int`, got `str`; query.limit: ...`` from Litestar's extra.

    Litestar's own ``detail`` repeats the URL with its query string; the per-field messages
    are what a caller needs, and msgspec never puts the offending value in them.
    """
    extra = exc.extra if isinstance(exc.extra, list) else []
    parts = [_field_message(item) for item in extra if isinstance(item, dict)]
    return "; ".join(parts) if parts else "the request is not valid"


def _field_message(item: dict[str, Any]) -> str:
    raw_source = item.get("source") or "request"
    source = str(getattr(raw_source, "value", raw_source))  # Litestar passes a ParamType enum
    key = str(item.get("key") or "")
    where = source if key in ("", "data") else f"{source}.{key}"
    return f"{where}: {item.get('message', 'invalid')}"


def _log_bug(request: Request[Any, Any, Any], exc: Exception) -> None:
    # The traceback's frames, not the exception's text: see the module docstring.
    frames = "".join(traceback.format_tb(exc.__traceback__))
    log.error(
        "unhandled %s on %s %s\n%s", type(exc).__name__, request.method, request.url.path, frames
    )


def error_responses(*statuses: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error statuses an operation can answer, all ``ErrorBody``;
    the edge checks' statuses are added to every operation."""
    return {
        status: ResponseSpec(data_container=ErrorBody, description=_DESCRIPTIONS[status])
        for status in sorted({*statuses, *EDGE_STATUSES})
    }


_DESCRIPTIONS: dict[int, str] = {
    400: "Malformed JSON, a body or parameter that fails validation, or a refused request",
    401: "Missing or invalid credentials",
    403: "Authenticated, but not allowed; or a state-changing request from another Origin",
    404: "No such run, or not one the caller may see",
    409: "The run's state refuses the request, or an idempotency key reused for another component",
    413: "The body is larger than [http] max_body_bytes",
    415: "A request body that is not JSON (Content-Type application/json or application/*+json)",
    421: "The Host header names a host this server does not answer to ([http] allowed_hosts)",
    422: "The Idempotency-Key header is longer than 512 characters",
    429: "The queue holds [queue] max_queue_depth queued runs",
    503: "The database is unavailable, or (for /queue) this replica runs no worker",
}
