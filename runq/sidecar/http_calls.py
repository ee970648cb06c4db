"""What the built-in HTTP components share: config reading, the pooled client, the lease
before a long call, bounded response reading, status classification and ``Retry-After``.

The classification: a failure that a later attempt may not repeat
(connection errors, timeouts, 408, 425, 429, 5xx) is ``Retryable``, honouring
``Retry-After`` as the earliest next attempt; a failure the same request would meet again
(other 4xx, a refused redirect, an oversized answer, a broken contract) is ``Permanent``.
"""

from __future__ import annotations

import asyncio
import email.utils
import enum
import math
import re
import string
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Protocol, TypeVar

import anyio
import httpx
import msgspec

from runq.errors import ConfigError, Permanent, Retryable
from runq.model import Actor, Resume
from runq.seal import read_secret

T = TypeVar("T")

#: How much of an error response is read to explain a failure; the rest is dropped.
ERROR_SNIPPET_BYTES = 512
DEFAULT_MAX_RESPONSE_BYTES = 1_048_576
#: Headers whose literal values are refused: they carry credentials, which belong in the
#: environment or a file, never in a config file that ends up in a repository.
_CREDENTIAL_HEADER_RE = re.compile(
    r"(authorization|cookie|token|secret|password|api[-_]?key)", re.IGNORECASE
)
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_SECRET_REF_RE = re.compile(r"^(env:[A-Za-z_]\w*|file:.+)$")


class SidecarContext(Protocol):
    """The part of ``runq.context.RunContext`` the built-in components use."""

    @property
    def run_id(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def session_id(self) -> str | None: ...

    @property
    def actor(self) -> Actor: ...

    @property
    def resume(self) -> Resume | None: ...

    def renew_lease_soon(self) -> None: ...

    async def pause(self, reason: str, state: Any = None, *, summary: str | None = None) -> Any: ...

    async def record_usage(self, *, tokens: int = 0, cost: float = 0.0) -> None: ...

    async def emit(self, kind: str, data: Any = None) -> None: ...


Handler = Callable[[Any, Any], Awaitable[Any]]
"""``async (ctx, payload) -> answer``, what ``ComponentRegistry.get`` hands the executor."""


# -- configuration ---------------------------------------------------------------------


def component_key(name: str, *path: str) -> str:
    """The dotted key of a component setting, as the operator writes it in the TOML."""
    return ".".join((f'components."{name}"', *path))


class SpecReader:
    """Typed reads of one component table; every error names the offending key.

    Every read key is remembered, so ``reject_unknown()`` can refuse a misspelt one the
    way the rest of the configuration does.
    """

    def __init__(self, name: str, spec: Mapping[str, Any], *path: str) -> None:
        self.name = name
        self.spec = spec
        self.path = path
        self._known: set[str] = set()

    def key(self, field: str) -> str:
        return component_key(self.name, *self.path, field)

    def _get(self, field: str) -> Any:
        self._known.add(field)
        return self.spec.get(field)

    def string(self, field: str, default: str | None = None, *, allow_empty: bool = False) -> str:
        value = self._get(field)
        if value is None:
            if default is None:
                raise ConfigError(self.key(field), "is required")
            return default
        if not isinstance(value, str) or not (value.strip() or allow_empty):
            raise ConfigError(self.key(field), f"{value!r} must be a non-empty string")
        return value.strip()

    def optional_string(self, field: str) -> str | None:
        return None if self._get(field) is None else self.string(field)

    def number(
        self,
        field: str,
        default: float | None,
        *,
        minimum: float = 0.0,
        maximum: float = math.inf,
        exclusive_minimum: bool = True,
    ) -> float:
        value = self._get(field)
        if value is None and default is not None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(self.key(field), f"{value!r} must be a number")
        too_small = value <= minimum if exclusive_minimum else value < minimum
        if too_small or value > maximum or not math.isfinite(value):
            low = f"> {minimum:g}" if exclusive_minimum else f">= {minimum:g}"
            high = "" if math.isinf(maximum) else f" and <= {maximum:g}"
            raise ConfigError(self.key(field), f"{value!r} must be {low}{high}")
        return float(value)

    def optional_number(
        self, field: str, *, minimum: float = 0.0, maximum: float = math.inf
    ) -> float | None:
        """An optional number in ``[minimum, maximum]``; None when not given."""
        if self._get(field) is None:
            return None
        return self.number(field, None, minimum=minimum, maximum=maximum, exclusive_minimum=False)

    def integer(self, field: str, default: int, *, minimum: int = 1) -> int:
        value = self._get(field)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(self.key(field), f"{value!r} must be an integer >= {minimum}")
        return value

    def boolean(self, field: str, default: bool) -> bool:
        value = self._get(field)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(self.key(field), f"{value!r} must be true or false")
        return value

    def table(self, field: str) -> SpecReader:
        value = self._get(field)
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(self.key(field), "must be a table, e.g. { key = value }")
        return SpecReader(self.name, value, *self.path, field)

    def reject_unknown(self) -> None:
        known = sorted(self._known)
        for field in self.spec:
            if field not in self._known:
                raise ConfigError(self.key(field), f"unknown key; known: {', '.join(known)}")


def resolve_reference(value: str, key: str) -> str:
    """``env:NAME`` / ``file:/path`` resolved now (a missing one stops the start), else the
    literal itself."""
    if _SECRET_REF_RE.match(value):
        return read_secret(value, key_name=key)
    return value


def require_reference(value: str, key: str) -> str:
    """A credential: only ``env:NAME`` or ``file:/path`` is accepted, never an inline value."""
    if not _SECRET_REF_RE.match(value):
        raise ConfigError(key, "must be 'env:NAME' or 'file:/path' (never an inline secret)")
    return read_secret(value, key_name=key)


def read_url(reader: SpecReader, field: str, default: str | None = None) -> httpx.URL:
    """An absolute http(s) URL, literal or from ``env:``/``file:``."""
    text = resolve_reference(reader.string(field, default), reader.key(field))
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as e:
        raise ConfigError(reader.key(field), f"{text!r} is not a URL ({e})") from e
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(reader.key(field), f"{text!r} is not an absolute http(s):// URL")
    return url


def display_url(url: httpx.URL) -> str:
    """The URL for errors and logs: without userinfo, query or fragment, where a token may
    hide (``?api_key=...``); the run's ``error`` is readable by more people than the config."""
    return str(url.copy_with(query=None, fragment=None, userinfo=b""))


def read_headers(reader: SpecReader, reserved: Callable[[str], bool]) -> dict[str, str]:
    """``headers = { Name = "value" }``. A value that starts with ``env:`` or ``file:`` is
    read from there at start; any other value is sent as written, except for credential
    headers (Authorization, Cookie, *Token*, *Secret*, *Api-Key*), which must be references.
    """
    table = reader.table("headers")
    headers: dict[str, str] = {}
    for name, value in table.spec.items():
        key = table.key(name)
        if not isinstance(name, str) or not _HEADER_NAME_RE.match(name):
            raise ConfigError(key, "is not a valid HTTP header name")
        if reserved(name.lower()):
            raise ConfigError(key, "is set by runq and cannot be configured")
        if not isinstance(value, str) or not value or "\n" in value or "\r" in value:
            raise ConfigError(key, "must be a one-line, non-empty string")
        if _CREDENTIAL_HEADER_RE.search(name):
            headers[name] = require_reference(value, key)
        else:
            headers[name] = resolve_reference(value, key)
    return headers


#: What a header value built from user data may keep as is: visible ASCII except ``%``.
_HEADER_SAFE = "".join(c for c in string.printable if c.isprintable() and c not in " %")


def header_value(text: str) -> str:
    """``text`` fit for an HTTP header: anything but visible ASCII (``josé``, spaces, control
    characters) and ``%`` itself are percent-encoded as UTF-8, so the receiver can always
    ``unquote`` the value, and a user id or session id can never fail the request."""
    return urllib.parse.quote(text, safe=_HEADER_SAFE)


def same_origin(url: httpx.URL, origin: httpx.URL) -> bool:
    """Whether ``url`` is on ``origin``, or its upgrade from http to https on the same host
    (the one redirect that keeps credentials as safe as before)."""
    if (url.scheme, url.host, url.port) == (origin.scheme, origin.host, origin.port):
        return True
    return (
        origin.scheme == "http"
        and url.scheme == "https"
        and url.host == origin.host
        and url.port is None
        and origin.port is None
    )


class CrossOriginRedirect(Permanent):
    """A redirect to another origin: the configured headers (credentials) and the run's
    headers would go there too. httpx drops only ``Authorization`` on such a redirect, so
    runq refuses it instead of following."""

    def __init__(self, url: httpx.URL, origin: httpx.URL) -> None:
        super().__init__(
            f"refused a redirect to {display_url(url)}: it leaves the origin of "
            f"{display_url(origin)}, which would receive the configured headers"
        )


# -- the pooled client -------------------------------------------------------------------


@dataclass(frozen=True)
class ClientSettings:
    timeout_seconds: float
    follow_redirects: bool = False
    max_redirects: int = 5
    #: The one origin requests may go to; a redirect elsewhere is refused.
    origin: httpx.URL | None = None


class PooledClient:
    """One ``httpx.AsyncClient`` (one connection pool) per component, made on first use.

    It is remade when the running event loop changes: a pool's connections belong to the
    loop that opened them, and a registry may outlive one loop (tests, ``runq enqueue``).
    """

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client.is_closed or self._loop is not loop:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.settings.timeout_seconds),
                follow_redirects=self.settings.follow_redirects,
                max_redirects=self.settings.max_redirects,
                headers={"User-Agent": "runq-sidecar"},
                event_hooks={"request": [self._refuse_other_origins]},
            )
            self._loop = loop
        return self._client

    async def _refuse_other_origins(self, request: httpx.Request) -> None:
        """Called for every request, the redirected ones included, before it is sent."""
        origin = self.settings.origin
        if origin is not None and not same_origin(request.url, origin):
            raise CrossOriginRedirect(request.url, origin)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()


# -- in flight ------------------------------------------------------------------------


def before_long_call(ctx: SidecarContext) -> None:
    """Start a call that cannot checkpoint with a freshly renewed lease.

    Nothing else is needed while it is in flight: the worker's heartbeat renews every
    in-flight lease in one statement each ``lock_grace_seconds / 3``, and a cancel or a
    lost lease cancels the execution's scope, which interrupts the request and closes its
    connection. A per-call renewal loop would add a database write per call per second.
    """
    ctx.renew_lease_soon()


# -- responses -------------------------------------------------------------------------


class Outcome(enum.Enum):
    SUCCESS = "success"
    REDIRECT = "redirect"
    RETRYABLE = "retryable"
    PERMANENT = "permanent"


#: Client errors a later attempt may not meet: a timeout, "too early", and a rate limit.
RETRYABLE_CLIENT_STATUSES = frozenset({408, 425, 429})


def classify_status(status: int) -> Outcome:
    if 200 <= status < 300:
        return Outcome.SUCCESS
    if 300 <= status < 400:
        return Outcome.REDIRECT
    if status in RETRYABLE_CLIENT_STATUSES or status >= 500:
        return Outcome.RETRYABLE
    return Outcome.PERMANENT


def parse_retry_after(headers: httpx.Headers, now: float | None = None) -> float | None:
    """Seconds until the earliest next attempt, from ``Retry-After`` (delta-seconds or an
    HTTP date) or OpenAI's ``retry-after-ms``; None when absent or unreadable."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        return _seconds_until_http_date(raw, now)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _seconds_until_http_date(text: str, now: float | None) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": RFC 9110 dates are GMT whatever they say
        when = when.replace(tzinfo=UTC)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


class ResponseTooLarge(Permanent):
    def __init__(self, limit: int) -> None:
        super().__init__(f"response larger than {limit} bytes (max_response_bytes)")


async def read_limited(response: httpx.Response, limit: int) -> bytes:
    """The (decoded) body, refused as soon as it passes ``limit`` bytes: neither a declared
    Content-Length nor a stream that never ends can make runq hold more than that."""
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ResponseTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise ResponseTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_snippet(response: httpx.Response) -> str:
    """The start of an error body, one line, for the run's ``error`` field."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= ERROR_SNIPPET_BYTES:
            break
    text = b"".join(chunks)[:ERROR_SNIPPET_BYTES].decode("utf-8", errors="replace")
    return " ".join(text.split())


def is_json(response: httpx.Response) -> bool:
    media = str(response.headers.get("content-type", "")).split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def decode_text(response: httpx.Response, body: bytes) -> str:
    return body.decode(response.charset_encoding or "utf-8", errors="replace")


def status_failure(
    what: str, response: httpx.Response, snippet: str, *, hint: str = ""
) -> Retryable | Permanent:
    """The exception for a non-success status: Retryable (with Retry-After) or Permanent."""
    message = f"{what} answered {response.status_code} {response.reason_phrase}".rstrip()
    if hint:
        message += f" ({hint})"
    if snippet:
        message += f": {snippet}"
    if classify_status(response.status_code) is Outcome.RETRYABLE:
        return Retryable(message, retry_after=parse_retry_after(response.headers))
    return Permanent(message)


async def exchange(
    client: httpx.AsyncClient,
    request: httpx.Request,
    *,
    timeout_seconds: float,
    what: str,
    read: Callable[[httpx.Response], Awaitable[T]],
) -> T:
    """Send ``request`` and ``read`` its streamed response within ``timeout_seconds`` (from
    connect to the last byte), turning transport failures into classified errors."""
    try:
        with anyio.fail_after(timeout_seconds):
            response = await client.send(request, stream=True)
            try:
                return await read(response)
            finally:
                await response.aclose()
    except httpx.TooManyRedirects as e:
        raise Permanent(f"{what}: {e}") from e
    except (httpx.HTTPError, TimeoutError) as e:
        raise transport_failure(what, e) from e


def transport_failure(what: str, error: httpx.HTTPError | TimeoutError) -> Retryable:
    """Connection refused or reset, DNS, TLS, a timeout: the next attempt may get through."""
    if isinstance(error, httpx.TimeoutException | TimeoutError):
        return Retryable(f"{what} timed out")
    detail = str(error) or type(error).__name__
    return Retryable(f"{what} failed: {detail}")


def json_bytes(value: Any) -> bytes:
    try:
        return msgspec.json.encode(value)
    except (TypeError, msgspec.EncodeError) as e:
        raise Permanent(f"the payload cannot be sent as JSON: {e}") from e
