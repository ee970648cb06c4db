"""Who is using the console, and whether a form they sent may change anything.

The console authenticates exactly as the API does, with the same authenticator, so a key
or token that the API refuses is refused here too:

- ``open``: nobody signs in; every caller is the anonymous admin, but only from a loopback
  address *and* with a loopback ``Host`` header. The second check stops a page on another
  site from reaching the console through a DNS name rebound to 127.0.0.1.
- ``key`` / ``jwt``: the sign-in form takes the key or token and keeps it in a cookie that
  scripts cannot read (``HttpOnly``), that no other site's page sends (``SameSite=Strict``)
  and, behind TLS, that never travels in clear (``Secure``). Each request re-verifies it,
  so an expired token ends the session by itself.

Every state-changing form carries a CSRF token derived from the session's credential
(an HMAC keyed by its digest): another site cannot compute it without the credential,
any replica can check it without shared state, and it changes when the user signs in with
another key or token. In ``open`` mode, where there is no credential, the key is a secret
drawn once per process. Requests whose ``Origin`` names another site are refused as well.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any, cast
from urllib.parse import urlsplit

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from litestar.handlers.base import BaseRouteHandler

from runq.api import AUTHENTICATOR_STATE_KEY
from runq.api.auth import ANONYMOUS_ADMIN, Authenticator, Forbidden, Identity, Unauthenticated
from runq.config import is_loopback
from runq.errors import RunqError

Connection = ASGIConnection[Any, Any, Any, Any]
#: Any request a console route handles (the one spelling every page module uses).
AnyRequest = Request[Any, Any, Any]

#: The session cookie: the key or token, scoped to the console's paths.
SESSION_COOKIE = "runq_session"
#: Before sign-in there is no credential to derive a CSRF token from: the sign-in form is
#: protected by a random value both in this cookie and in the form (double submit).
SIGNIN_COOKIE = "runq_signin"
COOKIE_PATH = "/ui"
#: Longest credential the sign-in form accepts; a JWT with many scopes stays far below.
MAX_CREDENTIAL_CHARS = 8192

_IDENTITY_STATE_KEY = "runq_ui_identity"
_CSRF_CONTEXT = b"runq-console-csrf-v1"
#: The CSRF key of ``open`` mode: one process, loopback only, so no replica must agree.
_OPEN_MODE_SECRET = secrets.token_bytes(32)


class SignInRequired(RunqError):
    """No session, or one whose credential no longer verifies: go to the sign-in page."""


class CsrfRefused(RunqError):
    """A state-changing request without a valid CSRF token or from another origin (403)."""


def authenticator_of(connection: Connection) -> Authenticator:
    return cast(Authenticator, connection.app.state[AUTHENTICATOR_STATE_KEY])


def is_tls(connection: Connection) -> bool:
    return connection.url.scheme == "https"


def _host_name(host_header: str) -> str:
    """``Host`` without its port (``[::1]:7777`` → ``::1``)."""
    return urlsplit(f"//{host_header}").hostname or ""


def require_loopback(connection: Connection) -> None:
    """``open`` mode: the caller and the name it used must both be this machine."""
    client = connection.client.host if connection.client else ""
    host = _host_name(connection.headers.get("host", ""))
    if not (is_loopback(client) and is_loopback(host)):
        raise Forbidden(
            "this console runs without authentication ([http] auth = open) and answers "
            "loopback requests only"
        )


def session_credential(connection: Connection) -> str | None:
    value = connection.cookies.get(SESSION_COOKIE)
    return value if value else None


def identify(connection: Connection) -> Identity:
    authenticator = authenticator_of(connection)
    if authenticator.mode == "open":
        require_loopback(connection)
        return ANONYMOUS_ADMIN
    credential = session_credential(connection)
    if credential is None:
        raise SignInRequired("sign in to use the console")
    try:
        return authenticator.authenticate(f"Bearer {credential}")
    except Unauthenticated as e:
        raise SignInRequired(f"your session ended: {e}") from e


def ui_authenticate(connection: Connection, _handler: BaseRouteHandler) -> None:
    """Guard of every console page except sign-in and static files."""
    connection.state[_IDENTITY_STATE_KEY] = identify(connection)


def ui_require_admin(connection: Connection, _handler: BaseRouteHandler) -> None:
    """Guard of ``/ui/queue``: the operator pages need the admin scope."""
    if not identity_of(connection).is_admin:
        raise Forbidden("the queue pages need the admin scope")


def identity_of(connection: Connection) -> Identity:
    return cast(Identity, connection.state[_IDENTITY_STATE_KEY])


def verify_credential(connection: Connection, credential: str) -> Identity:
    """The identity a sign-in credential stands for; raises ``Unauthenticated``."""
    if not credential or len(credential) > MAX_CREDENTIAL_CHARS or not credential.isprintable():
        raise Unauthenticated("that is not a key or token")
    return authenticator_of(connection).authenticate(f"Bearer {credential}")


# -- CSRF ------------------------------------------------------------------------------------


def csrf_token(connection: Connection) -> str:
    credential = session_credential(connection)
    if authenticator_of(connection).mode == "open" or credential is None:
        key = _OPEN_MODE_SECRET
    else:
        key = hashlib.sha256(credential.encode()).digest()
    return hmac.new(key, _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def check_same_origin(connection: Connection) -> None:
    """A browser names the page's origin on every POST; refuse one from another site."""
    origin = connection.headers.get("origin")
    if origin is None:
        return  # non-browser clients; the CSRF token still decides
    host = connection.headers.get("host", "")
    if origin == "null" or urlsplit(origin).netloc.lower() != host.lower():
        raise CsrfRefused("this form was sent from another site")


def check_csrf(connection: Connection, presented: str | None) -> None:
    check_same_origin(connection)
    if not presented or not hmac.compare_digest(presented, csrf_token(connection)):
        raise CsrfRefused("this form's security token is missing or stale; reload the page")


def check_signin_csrf(connection: Connection, presented: str | None) -> None:
    check_same_origin(connection)
    expected = connection.cookies.get(SIGNIN_COOKIE)
    if not presented or not expected or not hmac.compare_digest(presented, expected):
        raise CsrfRefused("the sign-in form expired; reload it and try again")


# -- cookies ---------------------------------------------------------------------------------


def _cookie(connection: Connection, key: str, value: str, *, max_age: int | None) -> Cookie:
    return Cookie(
        key=key,
        value=value,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=is_tls(connection),
        max_age=max_age,
    )


def session_cookie(connection: Connection, credential: str) -> Cookie:
    """A browser-session cookie: closing the browser ends it; a JWT's ``exp`` ends it sooner."""
    return _cookie(connection, SESSION_COOKIE, credential, max_age=None)


def cleared_session_cookie(connection: Connection) -> Cookie:
    return _cookie(connection, SESSION_COOKIE, "", max_age=0)


def new_signin_cookie(connection: Connection) -> Cookie:
    return _cookie(connection, SIGNIN_COOKIE, secrets.token_urlsafe(32), max_age=3600)


__all__ = [
    "SESSION_COOKIE",
    "CsrfRefused",
    "SignInRequired",
    "check_csrf",
    "check_signin_csrf",
    "cleared_session_cookie",
    "csrf_token",
    "identify",
    "identity_of",
    "new_signin_cookie",
    "session_cookie",
    "ui_authenticate",
    "ui_require_admin",
    "verify_credential",
]
