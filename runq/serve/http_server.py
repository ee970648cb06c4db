"""The HTTP server glue of ``runq serve``: uvicorn embedded in the supervisor's task group.

The listening socket is bound by the supervisor (a busy port is a configuration error
naming ``http.listen``), signals stay with the supervisor, and a request's headers and
body must arrive within ``[http] request_timeout_seconds``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import anyio
import uvicorn

from runq.errors import ConfigError
from runq.serve.http_protocol import protocol_with_request_timeout

if TYPE_CHECKING:
    from litestar import Litestar

HTTP_SHUTDOWN_SECONDS = 5


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind here, so a busy port is a clear start-up error rather than uvicorn's exit."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError("http.listen", f"cannot listen on {host}:{port}: {e.strerror}") from e
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class EmbeddedServer(uvicorn.Server):
    """uvicorn inside our task group: the supervisor owns the signals; ``done`` is set
    once the server has stopped."""

    def __init__(self, config: uvicorn.Config, done: anyio.Event) -> None:
        super().__init__(config)
        self._done = done

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().serve(sockets)
        finally:
            self._done.set()


#: The loggers uvicorn writes to; their lines belong to runq's HTTP server.
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")
HTTP_LOGGER = "runq.http"


class _ToRunqHttp(logging.Handler):
    """Hands a uvicorn record on as ``runq.http``: operators filter one namespace, and
    ``uvicorn.error`` naming ordinary start-up lines only misleads."""

    def __init__(self) -> None:
        super().__init__()
        self._target = logging.getLogger(HTTP_LOGGER)

    def emit(self, record: logging.LogRecord) -> None:
        if self._target.isEnabledFor(record.levelno):
            record.name = HTTP_LOGGER
            self._target.handle(record)


def route_uvicorn_logs() -> None:
    """Send uvicorn's log lines through ``runq.http`` (once; idempotent)."""
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, _ToRunqHttp) for h in logger.handlers):
            logger.addHandler(_ToRunqHttp())
        logger.propagate = False


def embedded_server(app: Litestar, done: anyio.Event, request_timeout: float) -> EmbeddedServer:
    route_uvicorn_logs()
    config = uvicorn.Config(
        app,
        lifespan="on",
        log_config=None,
        loop="none",
        access_log=False,
        timeout_graceful_shutdown=HTTP_SHUTDOWN_SECONDS,
        # Slow or silent clients are cut off instead of holding connections for good.
        http=protocol_with_request_timeout(request_timeout),
    )
    return EmbeddedServer(config, done)
