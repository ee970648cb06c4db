"""Built-in components for runq as a sidecar: configured, not coded (docs/sidecar.md).

``kind = "http"`` calls back into the application (``http_component``);
``kind = "openai-chat"`` calls an OpenAI-compatible chat endpoint (``openai_chat``).
``runq.components.ComponentRegistry`` builds a handler for each ``[components]`` table
with the kind module's ``build_handler(name, spec)``; a bad table raises
``runq.errors.ConfigError`` naming its key (``components."task/render".url``), so the
daemon refuses to start.
"""

from __future__ import annotations

from runq.sidecar.http_calls import Handler
from runq.sidecar.http_component import build_http_component
from runq.sidecar.openai_chat import build_openai_chat_component


async def close_component(handler: object) -> None:
    """Close the connection pool behind a built-in handler (a no-op for any other), for
    a registry that shuts down its handlers."""
    owner = getattr(handler, "__self__", None)
    aclose = getattr(owner, "aclose", None)
    if aclose is not None:
        await aclose()


__all__ = ["Handler", "build_http_component", "build_openai_chat_component", "close_component"]
