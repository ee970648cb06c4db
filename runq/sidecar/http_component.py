"""``kind = "http"``: execute a run by calling back into the application over HTTP.

```toml
[components."task/render"]
kind = "http"
url = "http://127.0.0.1:8080/render"       # literal, or "env:NAME" / "file:/path"
method = "POST"                            # POST | PUT | PATCH
timeout_seconds = 30                       # one request, connect to last byte
max_response_bytes = 1048576               # a larger answer fails the run (permanent)
follow_redirects = false                   # a 3xx fails the run (permanent) unless true;
                                           # never followed to another origin
headers = { Authorization = "env:APP_TOKEN", Accept = "application/json" }
poll = { enabled = true, interval_seconds = 2, max_seconds = 3600 }
```

The request: the run's payload, JSON-encoded, is the body, with ``Runq-Run-Id``,
``Runq-Attempt``, ``Runq-Component``, ``Runq-Session-Id`` and ``Runq-User-Id`` (when the
run has them; the last two percent-encoded, as they come from callers) and
``Idempotency-Key: <run id>:<attempt>``. A continued run (after a pause)
sends ``Runq-Resume: 1`` and the body ``{"payload": ..., "resume": {"state": ...,
"decision": ...}}``.

The answer: 2xx completes the run with the body (JSON-decoded when the Content-Type is
JSON, text otherwise, None when empty). 202 with a ``Location`` is polled with GET (same
origin only) until it answers something other than 202. A JSON body
``{"runq": {"pause": {"reason": "approval", "state": {...}}}}`` pauses the run. 408, 425,
429, 5xx, timeouts and connection errors are retryable (``Retry-After`` is the earliest
next attempt); other statuses are permanent. See ``docs/sidecar.md``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import msgspec

from runq.errors import ConfigError, Permanent, Retryable
from runq.log import get_logger
from runq.sidecar.http_calls import (
    DEFAULT_MAX_RESPONSE_BYTES,
    ClientSettings,
    Handler,
    Outcome,
    PooledClient,
    SidecarContext,
    SpecReader,
    before_long_call,
    classify_status,
    decode_text,
    display_url,
    exchange,
    header_value,
    is_json,
    json_bytes,
    parse_retry_after,
    read_headers,
    read_limited,
    read_snippet,
    read_url,
    status_failure,
)

log = get_logger(__name__)

METHODS = ("POST", "PUT", "PATCH")
#: Set by runq on every request; a configured header of these names would be ambiguous.
_RESERVED_HEADERS = frozenset(
    {"host", "content-type", "content-length", "transfer-encoding", "idempotency-key"}
)


def _is_reserved(lower_name: str) -> bool:
    return lower_name in _RESERVED_HEADERS or lower_name.startswith("runq-")


@dataclass(frozen=True)
class PollSettings:
    enabled: bool = True
    interval_seconds: float = 2.0
    max_seconds: float = 3600.0


@dataclass(frozen=True)
class HttpSettings:
    name: str
    url: httpx.URL
    method: str
    timeout_seconds: float
    max_response_bytes: int
    follow_redirects: bool
    headers: Mapping[str, str]
    poll: PollSettings


def read_settings(name: str, spec: Mapping[str, Any]) -> HttpSettings:
    """Validate the table at start; every error names its key."""
    reader = SpecReader(name, spec)
    reader.string("kind")
    method = reader.string("method", "POST").upper()
    if method not in METHODS:
        raise ConfigError(reader.key("method"), f"{method!r} is not one of {', '.join(METHODS)}")
    settings = HttpSettings(
        name=name,
        url=read_url(reader, "url"),
        method=method,
        timeout_seconds=reader.number("timeout_seconds", 30.0),
        max_response_bytes=reader.integer("max_response_bytes", DEFAULT_MAX_RESPONSE_BYTES),
        follow_redirects=reader.boolean("follow_redirects", False),
        headers=read_headers(reader, _is_reserved),
        poll=_read_poll(reader.table("poll")),
    )
    reader.reject_unknown()
    return settings


def _read_poll(reader: SpecReader) -> PollSettings:
    poll = PollSettings(
        enabled=reader.boolean("enabled", True),
        interval_seconds=reader.number("interval_seconds", 2.0),
        max_seconds=reader.number("max_seconds", 3600.0),
    )
    reader.reject_unknown()
    return poll


def build_http_component(name: str, spec: Mapping[str, Any]) -> Handler:
    """The factory ``ComponentRegistry`` calls for ``kind = "http"``; raises ConfigError."""
    return HttpComponent(read_settings(name, spec)).handle


#: The name ``runq.components.ComponentRegistry`` looks up in this module.
build_handler = build_http_component


@dataclass(frozen=True)
class _Final:
    """What a call ended with: an answer, or a pause the application asked for."""

    answer: Any = None
    pause: tuple[str, Any, str | None] | None = None


class HttpComponent:
    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self.pool = PooledClient(
            ClientSettings(
                settings.timeout_seconds,
                follow_redirects=settings.follow_redirects,
                origin=settings.url,
            )
        )
        self.what = f"{settings.name} ({settings.method} {display_url(settings.url)})"

    async def handle(self, ctx: SidecarContext, payload: Any) -> Any:
        """The handler: one call (and its polls), then the outcome."""
        before_long_call(ctx)
        final = await self._call(ctx, payload)
        if final.pause is not None:
            reason, state, summary = final.pause
            await ctx.pause(reason, state, summary=summary)  # raises PauseRequested
        return final.answer

    async def aclose(self) -> None:
        await self.pool.aclose()

    # -- the request ------------------------------------------------------------------

    async def _call(self, ctx: SidecarContext, payload: Any) -> _Final:
        headers = {**self.settings.headers, **self._run_headers(ctx)}
        body = payload
        if ctx.resume is not None:
            headers["Runq-Resume"] = "1"
            body = {
                "payload": payload,
                "resume": {"state": ctx.resume.state, "decision": ctx.resume.decision},
            }
        headers["Content-Type"] = "application/json"
        request = self.pool.get().build_request(
            self.settings.method, self.settings.url, headers=headers, content=json_bytes(body)
        )
        response, content = await self._send(request, self.what)
        location = response.headers.get("location")
        if response.status_code == 202 and location and self.settings.poll.enabled:
            return await self._poll(ctx, response)
        return self._final(response, content)

    def _run_headers(self, ctx: SidecarContext) -> dict[str, str]:
        headers = {
            "Runq-Run-Id": ctx.run_id,
            "Runq-Attempt": str(ctx.attempt),
            "Runq-Component": self.settings.name,
            "Idempotency-Key": f"{ctx.run_id}:{ctx.attempt}",
        }
        # Both come from callers (a JWT ``sub``, a session name): percent-encoded.
        if ctx.session_id:
            headers["Runq-Session-Id"] = header_value(ctx.session_id)
        if ctx.actor.user_id:
            headers["Runq-User-Id"] = header_value(ctx.actor.user_id)
        return headers

    async def _send(self, request: httpx.Request, what: str) -> tuple[httpx.Response, bytes]:
        """One request: the response and, on 2xx, its body. Anything but a 2xx (or a 3xx,
        which the poller or ``_final`` decides) raises here, classified."""

        async def read(response: httpx.Response) -> tuple[httpx.Response, bytes]:
            return response, await self._read(response, what)

        return await exchange(
            self.pool.get(),
            request,
            timeout_seconds=self.settings.timeout_seconds,
            what=what,
            read=read,
        )

    async def _read(self, response: httpx.Response, what: str) -> bytes:
        outcome = classify_status(response.status_code)
        if outcome is Outcome.SUCCESS:
            return await read_limited(response, self.settings.max_response_bytes)
        if outcome is Outcome.REDIRECT:
            return b""  # the poller follows a 303 to the result; _final refuses the rest
        raise status_failure(what, response, await read_snippet(response))

    def _final(self, response: httpx.Response, content: bytes) -> _Final:
        if 300 <= response.status_code < 400:
            raise Permanent(
                f"{self.what} answered {response.status_code} (redirect to "
                f"{response.headers.get('location')}); set follow_redirects = true to follow it"
            )
        answer = self._decode(response, content)
        return _Final(answer=answer, pause=pause_request(answer, self.what))

    def _decode(self, response: httpx.Response, content: bytes) -> Any:
        if not content:
            return None
        if is_json(response):
            try:
                return msgspec.json.decode(content)
            except msgspec.DecodeError as e:
                # The application said JSON and sent something else: the same request
                # would get the same broken answer, so retrying cannot help.
                raise Permanent(
                    f"{self.what} answered {response.status_code} with Content-Type "
                    f"{response.headers.get('content-type')} and a body that is not JSON: {e}"
                ) from e
        return decode_text(response, content)

    # -- polling ----------------------------------------------------------------------

    async def _poll(self, ctx: SidecarContext, accepted: httpx.Response) -> _Final:
        """GET the ``Location`` of a 202 until it is final.

        Transient failures while polling (connection errors, 5xx, 429) do not end the
        attempt: the work is already accepted, and a retry would start it a second time
        under a new idempotency key. They wait and poll again, until ``max_seconds``.
        """
        poll = self.settings.poll
        interval = poll.interval_seconds
        deadline = time.monotonic() + poll.max_seconds
        url = self._poll_url(accepted.request.url, accepted.headers["location"])
        wait = _poll_wait(accepted, interval)
        headers = {**self.settings.headers, **self._run_headers(ctx)}
        while True:
            if time.monotonic() + wait > deadline:
                raise Retryable(
                    f"{self.what} was still not final after poll.max_seconds "
                    f"({poll.max_seconds:g}s) at {display_url(url)}"
                )
            await anyio.sleep(wait)
            what = f"{self.settings.name} (poll GET {display_url(url)})"
            request = self.pool.get().build_request("GET", url, headers=headers)
            try:
                response, content = await self._send(request, what)
            except Retryable as e:
                log.info(
                    "sidecar.poll_retry",
                    component=self.settings.name,
                    run_id=ctx.run_id,
                    attempt=ctx.attempt,
                    error=str(e),
                )
                wait = max(e.retry_after or 0.0, interval)
                continue
            location = response.headers.get("location")
            if response.status_code == 202 or (response.status_code == 303 and location):
                if location:
                    url = self._poll_url(url, location)
                # A 303 points at the finished result: fetch it now, without a pause.
                wait = 0.0 if response.status_code == 303 else _poll_wait(response, interval)
                continue
            return self._final(response, content)

    def _poll_url(self, base: httpx.URL, location: str) -> httpx.URL:
        """Resolve a Location against the URL it came from; refuse another origin, because
        the configured headers (credentials) would go there too."""
        url = base.join(location)
        origin = (self.settings.url.scheme, self.settings.url.host, self.settings.url.port)
        if (url.scheme, url.host, url.port) != origin:
            raise Permanent(
                f"{self.what} asked to poll {display_url(url)}, which is not on the origin of url"
            )
        return url


def _poll_wait(response: httpx.Response, interval: float) -> float:
    """The application may pace the poller with ``Retry-After`` on its 202."""
    retry_after = parse_retry_after(response.headers)
    return interval if retry_after is None else retry_after


def pause_request(answer: Any, what: str) -> tuple[str, Any, str | None] | None:
    """``{"runq": {"pause": {"reason": str, "state": any, "summary": str}}}`` →
    (reason, state, summary); else None. ``state`` and ``summary`` are optional.

    Only a JSON object whose ``runq`` member is an object with ``pause`` counts; a body that
    names ``runq`` but breaks the shape is refused, so a typo never completes a run that
    was meant to wait for a human.
    """
    if not isinstance(answer, dict) or "runq" not in answer:
        return None
    control = answer["runq"]
    pause = control.get("pause") if isinstance(control, dict) else None
    if not isinstance(pause, dict) or not isinstance(pause.get("reason"), str):
        raise Permanent(
            f"{what} answered a 'runq' control object that is not "
            '{"runq": {"pause": {"reason": "...", "state": ...}}}'
        )
    reason = pause["reason"].strip()
    if not reason:
        raise Permanent(f"{what} asked to pause with an empty reason")
    summary = pause.get("summary")
    if summary is not None and not isinstance(summary, str):
        raise Permanent(f"{what} asked to pause with a summary that is not a string")
    return reason, pause.get("state"), summary
