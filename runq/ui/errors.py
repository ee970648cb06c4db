"""Errors on console pages answer as pages, not as the API's JSON.

A person in a browser needs a page that says what went wrong and where to go next; the
status code stays the API's (403 for a missing scope, 404 for a run one may not see ...)
so tests and tools still read the outcome. A lapsed session goes back to sign-in, keeping
the page that was asked for.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any
from urllib.parse import quote

from litestar import Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.response import Redirect

from runq.api.problems import runq_error_status, validation_detail
from runq.errors import RunqError
from runq.ui.render import render
from runq.ui.session import AnyRequest, CsrfRefused, SignInRequired, identify

log = logging.getLogger("runq.ui")

_TITLES: dict[int, str] = {
    400: "That request is not valid",
    401: "Sign in needed",
    403: "Not allowed",
    404: "Not found",
    405: "Not allowed here",
    409: "Not possible in the run's current state",
    413: "Too large",
    415: "Not a form this page takes",
    421: "Wrong address for this server",
    429: "The queue is full",
    500: "Something went wrong",
    503: "Unavailable",
}


def status_of(error: RunqError) -> int:
    """The API's status for the error (one table, in ``runq.api.problems``); 403 for CSRF."""
    if isinstance(error, CsrfRefused):
        return 403
    mapped = runq_error_status(error)
    return 500 if mapped is None else mapped[0]


def error_page(request: AnyRequest, status: int, detail: str) -> Response[Any]:
    try:
        identity = identify(request)
    except RunqError:
        identity = None  # the error page must render for anyone, signed in or not
    return render(
        request,
        "error.html",
        status_code=status,
        identity=identity,
        title=_TITLES.get(status, "Error"),
        status=status,
        detail=detail,
    )


def handle_ui_exception(request: AnyRequest, exc: Exception) -> Response[Any]:
    if isinstance(exc, SignInRequired):
        target = request.url.path
        if request.url.query:
            target += f"?{request.url.query}"
        if request.method != "GET":
            return error_page(request, 401, str(exc))
        return Redirect(f"/ui/signin?next={quote(target, safe='')}", status_code=303)
    if isinstance(exc, RunqError):
        status = status_of(exc)
        if status == 500:
            log.error("console: unmapped %s", type(exc).__name__)
            return error_page(request, 500, "internal error; the server log has the details")
        return error_page(request, status, str(exc))
    if isinstance(exc, ValidationException):
        return error_page(request, 400, validation_detail(exc))
    if isinstance(exc, HTTPException):
        return error_page(request, exc.status_code, str(exc.detail))
    # Like the API: the type and the frames, never the message (it may carry run content).
    frames = "".join(traceback.format_tb(exc.__traceback__))
    log.error("console: unhandled %s on %s\n%s", type(exc).__name__, request.url.path, frames)
    return error_page(request, 500, "internal error; the server log has the details")
