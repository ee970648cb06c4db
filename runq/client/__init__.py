"""A client of the runq HTTP API: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

    from runq.client import Client

    with Client("http://127.0.0.1:7777", api_key=key) as client:
        accepted = client.submit("task", "echo", {"hello": "world"})
        run = client.wait(accepted.run_id, timeout=30)

It speaks HTTP only (httpx, httpx-sse for events) and decodes with the API's own msgspec
types (``runq.api.schemas``); it imports nothing of the store, the worker or the server, so
an application that only submits runs needs no database driver at run time.
"""

from __future__ import annotations

from runq.api.schemas import BatchAccepted, RunOut, SubmitAccepted
from runq.client.async_client import AsyncClient
from runq.client.errors import (
    AuthError,
    BadRequestError,
    ClientError,
    ConflictError,
    NotFoundError,
    QueueFullError,
    UnavailableError,
)
from runq.client.sync_client import Client
from runq.client.wire import RunsPage
from runq.model import RunEvent, Status

__all__ = [
    "AsyncClient",
    "AuthError",
    "BadRequestError",
    "BatchAccepted",
    "Client",
    "ClientError",
    "ConflictError",
    "NotFoundError",
    "QueueFullError",
    "RunEvent",
    "RunOut",
    "RunsPage",
    "Status",
    "SubmitAccepted",
    "UnavailableError",
]
