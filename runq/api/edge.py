"""Checks at the edge of every request, before routing decisions, credentials or bodies.

They keep a web page in the operator's browser from driving the API, whatever the auth
mode (open mode has no credentials to protect it; in key and JWT modes they cost nothing):

- **Host** must be a name this server answers to (``RequestEdge.host_allowed``): a page on
  ``attacker.example`` whose DNS later points at 127.0.0.1 (DNS rebinding) reaches the
  loopback listener with ``Host: attacker.example`` and is refused with 421. An IP address
  is always accepted: no DNS is involved, so the browser's origin *is* this server.
- **Origin**, when a browser sends it on a state-changing request, must be the origin the
  request was addressed to; a cross-site form post or ``fetch`` is refused with 403.
- A request **body** must be JSON (``application/json`` or ``application/*+json``): the
  content types a cross-site form may send without a CORS preflight (``text/plain``,
  form encodings) are refused with 415 before the body is read.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from litestar.datastructures import Headers
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

from runq.config import HttpConfig, split_listen
from runq.errors import RunqError

#: Names every server answers to besides its listen host and any IP address.
LOOPBACK_NAMES = ("localhost",)
#: Methods that change state: a foreign ``Origin`` on them is refused.
STATE_CHANGING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: ``[http] allowed_hosts = ["*"]`` turns the Host check off (a proxy in front checks it).
ANY_HOST = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443}


class HostNotAllowed(RunqError):
    """The ``Host`` header names a host this server does not answer to (HTTP 421)."""


class OriginNotAllowed(RunqError):
    """A state-changing request from a foreign ``Origin`` (HTTP 403)."""


class UnsupportedMediaType(RunqError):
    """A request body that is not JSON (HTTP 415)."""


def split_host(value: str) -> tuple[str, int | None]:
    """``host[:port]`` (``[v6]:port`` too) as a normalised name and the port, if any."""
    value = value.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep or not port_text.isdigit():
            host, port_text = value, ""
    port = int(port_text) if port_text.isdigit() and len(port_text) <= 5 else None
    return host.lower().rstrip("."), port


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class EdgePolicy:
    """The names this server answers to, from ``[http] listen`` and ``allowed_hosts``."""

    names: frozenset[str]
    any_host: bool

    @classmethod
    def from_config(cls, http: HttpConfig) -> EdgePolicy:
        names = {*LOOPBACK_NAMES, *(split_host(h)[0] for h in http.allowed_hosts)}
        if http.listen:
            names.add(split_listen(http.listen)[0].lower())
        return cls(names=frozenset(names), any_host=ANY_HOST in http.allowed_hosts)

    def host_allowed(self, host: str) -> bool:
        return self.any_host or host in self.names or is_ip_address(host)


def same_origin(origin: str, host_header: str) -> bool:
    """``Origin`` names the scheme, host and port the request was sent to.

    The server cannot know its public scheme behind a proxy, so the origin's port is
    compared with the ``Host`` port, or with the scheme's default port when ``Host`` has
    none (a proxy on 443 forwards ``Host: runq.example.com``).
    """
    try:
        parts = urlsplit(origin.strip())
        origin_port = parts.port
    except ValueError:
        return False
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return False  # "null" (sandboxed frames, file:) and anything odd are foreign
    expected_host, expected_port = split_host(host_header)
    default_port = _DEFAULT_PORTS[parts.scheme]
    return parts.hostname.rstrip(".") == expected_host and (origin_port or default_port) == (
        expected_port or default_port
    )


def is_json_media_type(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def has_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    if length is not None:
        return length.strip() != "0"
    return "transfer-encoding" in headers


#: The console's pages post HTML forms (urlencoded); they carry a CSRF token instead.
FORM_PATH_PREFIX = "/ui/"


def check_request(policy: EdgePolicy, method: str, headers: Headers, path: str = "") -> None:
    """Raise the refusal for a request that fails an edge check; return if it passes."""
    host_header = headers.get("host")
    # No Host at all is an HTTP/1.0 client, never a browser (browsers always send one).
    if host_header is not None:
        _check_host(policy, host_header)
    origin = headers.get("origin")
    if method in STATE_CHANGING_METHODS and origin is not None:
        _check_origin(method, origin, host_header)
    if has_body(headers) and not path.startswith(FORM_PATH_PREFIX):
        _check_media_type(headers.get("content-type", ""))


def _check_host(policy: EdgePolicy, host_header: str) -> None:
    host, _ = split_host(host_header)
    if not policy.host_allowed(host):
        raise HostNotAllowed(
            f"this server does not answer to the host {host[:200]!r}; "
            "add it to [http] allowed_hosts if clients use that name"
        )


def _check_origin(method: str, origin: str, host_header: str | None) -> None:
    if host_header is None or not same_origin(origin, host_header):
        raise OriginNotAllowed(
            f"a {method} from another origin ({origin[:200]!r}) is refused; "
            "the API does not accept cross-site requests"
        )


def _check_media_type(content_type: str) -> None:
    if not is_json_media_type(content_type):
        raise UnsupportedMediaType(
            "a request body must be JSON (Content-Type: application/json); "
            f"got {(content_type or 'no Content-Type')[:200]!r}"
        )


class RequestEdge(ASGIMiddleware):
    """Runs ``check_request`` on every HTTP request; refusals go to the app's error handler."""

    scopes = (ScopeType.HTTP,)

    def __init__(self, policy: EdgePolicy) -> None:
        self.policy = policy

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        method = str(scope.get("method", "GET")).upper()
        path = str(scope.get("path", ""))
        check_request(self.policy, method, Headers.from_scope(scope), path)
        await next_app(scope, receive, send)
