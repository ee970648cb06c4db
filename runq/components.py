"""``[components]`` resolved at start: ``"type/id"`` → a handler.

A value is ``"module:function"`` (imported now, so a typo stops the start with a message
naming the key) or a table ``{kind = "http" | "openai-chat", ...}`` built by
``runq.sidecar.http_component`` / ``runq.sidecar.openai_chat`` (``build_handler(key, spec)``).
The built-ins of ``runq.builtin`` are always present unless the config overrides them.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from runq.builtin import BUILTINS
from runq.context import RunContext
from runq.errors import ConfigError

Handler = Callable[[RunContext, Any], Any]

_KIND_MODULES = {"http": "runq.sidecar.http_component", "openai-chat": "runq.sidecar.openai_chat"}


def is_async_handler(handler: Handler) -> bool:
    """Coroutine functions (or objects with an async ``__call__``) are awaited on the loop;
    anything else runs in a worker thread."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects, not callability
    return call is not None and inspect.iscoroutinefunction(call)


def _config_key(name: str) -> str:
    return f'components."{name}"'


def import_handler(name: str, target: str) -> Handler:
    """``"package.module:function"`` → the function; errors name the config key."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # any import-time error is a start-up error for this key
        raise ConfigError(_config_key(name), f"cannot import module {module_name!r}: {e}") from e
    handler = getattr(module, attr, None)
    if handler is None:
        raise ConfigError(_config_key(name), f"module {module_name!r} has no function {attr!r}")
    if not callable(handler):
        raise ConfigError(_config_key(name), f"{target!r} is not callable")
    return handler  # type: ignore[no-any-return]


def build_kind(name: str, spec: Mapping[str, Any]) -> Handler:
    kind = str(spec.get("kind"))
    module_name = _KIND_MODULES.get(kind)
    if module_name is None:
        raise ConfigError(f"{_config_key(name)}.kind", f"{kind!r} is not one of http, openai-chat")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(_config_key(name), f"kind {kind!r} is not available: {e}") from e
    builder = module.build_handler
    return builder(name, spec)  # type: ignore[no-any-return]


class ComponentRegistry:
    """The handlers this process can execute, by ``"type/id"``."""

    def __init__(self, handlers: Mapping[str, Handler], *, built: Sequence[Handler] = ()) -> None:
        self._handlers = dict(handlers)
        #: Handlers built from a ``kind`` table: they own connection pools to close.
        self._built = list(built)

    @classmethod
    def from_config(cls, components: Mapping[str, str | Mapping[str, Any]]) -> ComponentRegistry:
        handlers: dict[str, Handler] = {}
        built: list[Handler] = []
        for name, target in {**BUILTINS, **components}.items():
            if isinstance(target, str):
                handlers[name] = import_handler(name, target)
            else:
                handlers[name] = build_kind(name, target)
                built.append(handlers[name])
        return cls(handlers, built=built)

    async def aclose(self) -> None:
        """Close what built-in kinds opened (HTTP connection pools)."""
        if not self._built:
            return
        from runq.sidecar import close_component

        for handler in self._built:
            await close_component(handler)

    def get(self, component_type: str, component_id: str) -> Handler | None:
        return self._handlers.get(f"{component_type}/{component_id}")

    def knows(self, component_type: str, component_id: str) -> bool:
        return f"{component_type}/{component_id}" in self._handlers

    def names(self) -> list[str]:
        return sorted(self._handlers)
