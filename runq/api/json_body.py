"""Request bodies are decoded by msgspec, bounded in nesting depth.

msgspec decodes recursively and raises ``RecursionError`` on JSON nested a few thousand
levels deep (``[[[[...]]]]`` fits easily in the body limit). Left alone that is an
unhandled error (500) for what is only bad input. A value nested deeper than
``MAX_JSON_DEPTH`` is refused too: every later step (sealing, redaction, the worker's
handlers) walks the value recursively and must not be the first to find out.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from runq.errors import BadRequest

#: Deepest nesting of arrays and objects accepted in a request body (Ruby's JSON default).
MAX_JSON_DEPTH = 100


class JsonTooDeep(BadRequest):
    """A body nested deeper than ``MAX_JSON_DEPTH`` (HTTP 400)."""


def nesting_depth_exceeds(value: Any, limit: int) -> bool:
    """True when ``value`` nests lists and dicts deeper than ``limit`` (``[]`` is depth 1).

    Iterative and linear in the number of elements, so no input can exhaust the stack.
    """
    if not isinstance(value, list | dict):
        return False
    stack: list[tuple[list[Any] | dict[str, Any], int]] = [(value, 1)]
    if limit < 1:
        return True
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, list | dict):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _too_deep(body: bytes, value: Any) -> bool:
    # Fewer brackets than the limit cannot nest deeper than it; most bodies stop here.
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return False
    return nesting_depth_exceeds(value, MAX_JSON_DEPTH)


class JsonRequest(Request[Any, Any, Any]):
    """Litestar's request with a depth-bounded ``json()``; the app's ``request_class``."""

    async def json(self) -> Any:
        try:
            value = await super().json()
        except RecursionError as e:
            raise JsonTooDeep(self._too_deep_message()) from e
        if _too_deep(await self.body(), value):
            raise JsonTooDeep(self._too_deep_message())
        return value

    @staticmethod
    def _too_deep_message() -> str:
        return f"the body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels"
