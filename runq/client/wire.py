"""What the sync and async clients share: headers, bodies, decoding and the error mapping."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import httpx
import msgspec

from runq.api.schemas import MAX_BATCH_RUNS, RunsPage
from runq.client.errors import ClientError, error_for
from runq.model import FINAL_EVENT_KINDS, RunEvent, Status

T = TypeVar("T")

#: The longest ``?wait=`` the server accepts; longer waits are a loop of these.
MAX_WAIT_SECONDS = 60.0
#: Statuses ``wait`` returns at: the run ended, or it waits for a decision.
SETTLED = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.PAUSED})
#: Pause between reconnects of an event stream (doubling up to the cap).
RECONNECT_FIRST_DELAY = 0.2
RECONNECT_MAX_DELAY = 5.0

_event_decoder = msgspec.json.Decoder(RunEvent)


def auth_headers(api_key: str | None, token: str | None) -> dict[str, str]:
    """The API takes both an API key (``[http] auth = key``) and a JWT (``auth = jwt``) as
    ``Authorization: Bearer``; giving both is a mistake worth stopping early."""
    if api_key and token:
        raise ValueError("give api_key or token, not both")
    secret = api_key or token
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def submission(
    component_type: str, component_id: str, payload: Any, options: Mapping[str, Any]
) -> dict[str, Any]:
    """A run's JSON body; ``None`` options are left out (the server's defaults apply)."""
    body: dict[str, Any] = {
        "component_type": component_type,
        "component_id": component_id,
        "payload": payload,
    }
    body.update({k: v for k, v in options.items() if v is not None})
    return body


def batch_bodies(items: Iterable[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
    """Items for ``POST /runs/batch`` in chunks of at most ``MAX_BATCH_RUNS``. Each item is a
    mapping with ``component_type``, ``component_id`` and the other fields of ``POST /runs``
    (plus ``idempotency_key``); ``component: "type/id"`` is accepted for either pair."""
    chunks: list[list[dict[str, Any]]] = [[]]
    for item in items:
        body = dict(item)
        component = body.pop("component", None)
        if component is not None:
            body["component_type"], _, body["component_id"] = str(component).partition("/")
        if len(chunks[-1]) == MAX_BATCH_RUNS:
            chunks.append([])
        chunks[-1].append(body)
    return [c for c in chunks if c]


def list_params(filters: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for name, value in filters.items():
        if value is None:
            continue
        if isinstance(value, Status):
            value = value.value
        elif isinstance(value, list | tuple | set | frozenset):
            value = ",".join(v.value if isinstance(v, Status) else str(v) for v in value)
        params[name] = value
    return params


def decoded(response: httpx.Response, into: type[T]) -> T:
    """The body of a 2xx answer as ``into``; an error answer raises its ``ClientError``."""
    check(response)
    return msgspec.json.decode(response.content, type=into)


def check(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    raise error_for(response.status_code, body, response.headers.get("retry-after"))


def event_of(data: str) -> RunEvent:
    return _event_decoder.decode(data)


def is_final(event: RunEvent) -> bool:
    return event.kind in FINAL_EVENT_KINDS


class WaitClock:
    """The ``?wait=`` of each round of ``wait`` and whether the caller's timeout is up."""

    def __init__(self, timeout: float | None) -> None:
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def next_wait(self) -> float:
        if self.deadline is None:
            return MAX_WAIT_SECONDS
        return max(0.0, min(MAX_WAIT_SECONDS, self.deadline - time.monotonic()))

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


def read_timeout(client_timeout: float, wait: float) -> httpx.Timeout:
    """A long-poll's read timeout: the wait plus the client's own margin."""
    return httpx.Timeout(client_timeout, read=wait + client_timeout)


#: The server sends a keep-alive every 15 s: a stream silent for this long is dead (a
#: proxy that lost the connection) and is resumed.
STREAM_READ_TIMEOUT = 45.0

#: Stream failures after which ``events`` reconnects with ``Last-Event-ID``.
RECONNECTABLE = (httpx.TransportError,)


def reconnect_delay(failures: int) -> float:
    delay: float = RECONNECT_FIRST_DELAY * 2.0 ** max(failures - 1, 0)
    return min(delay, RECONNECT_MAX_DELAY)


__all__ = ["ClientError", "RunsPage"]
