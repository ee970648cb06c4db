"""The routing rule: which transport wakes the claimers for a component.

``[routing]`` maps patterns to transport names; the most specific pattern wins:
``"type/id"`` over ``"type/prefix*"`` (longer literal text first) over ``"type/*"`` over
``"*"``. A component no pattern matches uses ``sync``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import asyncpg

DEFAULT_ROUTE = "sync"
TRANSPORT_NAMES = ("sync", "local", "postgres")
#: The NOTIFY payload that wakes claimers, and the prefix of one that cancels a run.
WAKE_MESSAGE = "wake"
CANCEL_PREFIX = "cancel:"


def _specificity(pattern: str) -> tuple[int, int]:
    """Sort key, most specific first: exact names, then globs by their literal length."""
    if pattern == "*":
        return (2, 0)
    if "*" not in pattern:
        return (0, -len(pattern))
    return (1, -len(pattern.replace("*", "")))


def resolve_route(routing: Mapping[str, str], component_type: str, component_id: str) -> str:
    name = f"{component_type}/{component_id}"
    exact = routing.get(name)
    if exact is not None:
        return exact
    for pattern in sorted(routing, key=_specificity):
        if pattern == "*" or fnmatch.fnmatchcase(name, pattern):
            return routing[pattern]
    return DEFAULT_ROUTE


class Router:
    """Caches resolutions: routing is fixed for the life of a process."""

    def __init__(self, routing: Mapping[str, str]) -> None:
        self._routing = dict(routing)
        self._cache: dict[tuple[str, str], str] = {}

    def route(self, component_type: str, component_id: str) -> str:
        key = (component_type, component_id)
        found = self._cache.get(key)
        if found is None:
            found = resolve_route(self._routing, component_type, component_id)
            self._cache[key] = found
        return found


class ListenableStore(Protocol):
    """What the postgres transport needs of a store (``PostgresStore`` provides it)."""

    url: str
    channel: str

    async def notify(self, payload: str) -> None: ...

    def listen_connector(self) -> ListenConnector | None:
        """How the listener connects, or None where it cannot listen (poll only)."""


class ListenConnector(Protocol):
    """How the listener opens its connection and proves it still good (the PostgreSQL
    store's ``PrimaryConnector``: on the writable primary, through a failover)."""

    @property
    def target(self) -> str:
        """Where it connects, for logs (no password)."""

    async def connect(self) -> asyncpg.Connection: ...

    async def check(self, conn: asyncpg.Connection) -> None:
        """Raises (an ``OSError``) when the connection's server no longer takes writes."""


def parse_message(payload: str) -> tuple[str, str | None]:
    """``"wake"`` → ("wake", None); ``"cancel:<id>"`` → ("cancel", id); else ("unknown", None)."""
    if payload == WAKE_MESSAGE:
        return "wake", None
    if payload.startswith(CANCEL_PREFIX) and len(payload) > len(CANCEL_PREFIX):
        return "cancel", payload[len(CANCEL_PREFIX) :]
    return "unknown", None
