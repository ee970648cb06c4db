"""The client's exceptions: every error answer of the API, with its ``error`` and ``detail``."""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """An error answer of the runq API: ``status`` (HTTP), ``error`` (the stable word, e.g.
    ``queue_full``) and ``detail`` (the server's reason, e.g. ``items[517]: ...``)."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail


class BadRequestError(ClientError):
    """400, 413, 415, 422: the request itself is wrong; retrying it unchanged will not help."""


class AuthError(ClientError):
    """401 or 403: missing or refused credentials, or not allowed."""


class NotFoundError(ClientError):
    """404: no such run, or one these credentials may not see."""


class ConflictError(ClientError):
    """409: the run's state refuses the request, or an idempotency key reused elsewhere."""


class QueueFullError(ClientError):
    """429: the queue's depth limits refuse the submission; ``retry_after`` seconds."""

    retry_after: float | None = None


class UnavailableError(ClientError):
    """503 (and any 5xx): the server or its database cannot answer now."""


_BY_STATUS: dict[int, type[ClientError]] = {
    400: BadRequestError,
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    409: ConflictError,
    413: BadRequestError,
    415: BadRequestError,
    422: BadRequestError,
    429: QueueFullError,
}


def error_for(status: int, body: Any, retry_after: str | None = None) -> ClientError:
    """The exception for an error answer (``body``: its decoded JSON, or None)."""
    error, detail = "error", ""
    if isinstance(body, dict):
        error = str(body.get("error") or error)
        detail = str(body.get("detail") or "")
    family = _BY_STATUS.get(status, UnavailableError if status >= 500 else ClientError)
    exc = family(status, error, detail or f"HTTP {status}")
    if isinstance(exc, QueueFullError) and retry_after and retry_after.isdigit():
        exc.retry_after = float(retry_after)
    return exc
