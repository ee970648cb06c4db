"""``[routing]`` and ``[components]``: which handler serves which component."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from runq.config.checks import require
from runq.config.limits import is_component_pattern
from runq.config.queue import TRANSPORTS
from runq.config.root import Config
from runq.config.store import store_engine
from runq.model import COMPONENT_TYPES

COMPONENT_KINDS = ("http", "openai-chat")

_HANDLER_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def validate_routing(config: Config) -> None:
    engine = store_engine(config.store.url)
    for pattern, transport in config.routing.items():
        key = f'routing."{pattern}"'
        require(
            transport in TRANSPORTS, key, f"{transport!r} is not one of {', '.join(TRANSPORTS)}"
        )
        require(
            is_component_pattern(pattern),
            key,
            "a pattern is '*', 'type/*' or 'type/id'",
        )
        if transport == "postgres":
            require(
                engine == "postgres", key, "the postgres transport needs a PostgreSQL store.url"
            )


def validate_components(components: Mapping[str, Any]) -> None:
    for name, spec in components.items():
        key = f'components."{name}"'
        ctype, sep, cid = name.partition("/")
        require(
            bool(sep and cid) and ctype in COMPONENT_TYPES,
            key,
            f"a component is 'type/id' with type one of {', '.join(sorted(COMPONENT_TYPES))}",
        )
        if isinstance(spec, str):
            require(bool(_HANDLER_RE.match(spec)), key, f"{spec!r} is not 'module:function'")
        else:
            kind = spec.get("kind")
            require(
                kind in COMPONENT_KINDS,
                f"{key}.kind",
                f"{kind!r} is not one of {', '.join(COMPONENT_KINDS)}",
            )
