"""The routing rule: which transport wakes the claimers for a component.

``[routing]`` maps patterns to transport names; the most specific pattern wins:
``"type/id"`` over ``"type/prefix*"`` (longer literal text first) over ``"type/*"`` over
``"*"``. A component no pattern matches uses ``sync``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

DEFAULT_ROUTE = "sync"
TRANSPORT_NAMES = ("sync", "local", "postgres")


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
