"""Real local HTTP servers for the sidecar tests: uvicorn on a free 127.0.0.1 port, in a
thread, serving a tiny scripted ASGI app.

A test scripts each path with a function ``(RecordedRequest) -> Reply`` (or a list of
replies, answered in turn) and reads back every request the server received. The server
runs on its own loop in its own thread, so a delayed reply never blocks the test's loop,
and a ``runq serve`` subprocess can call it too.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import uvicorn


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    received_at: float

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: Sequence[tuple[str, str]] = ()
    #: Seconds to wait before the response starts (a slow application).
    delay: float = 0.0
    #: Sent after ``body`` in separate writes, ``chunk_delay`` apart (a streaming answer).
    chunks: Sequence[bytes] = ()
    chunk_delay: float = 0.0
    #: Break the connection after the headers and body so far (a crash mid-response).
    abort: bool = False

    @classmethod
    def json(cls, value: Any, status: int = 200, **kw: Any) -> Reply:
        headers = [("content-type", "application/json"), *kw.pop("headers", ())]
        return cls(status=status, body=msgspec.json.encode(value), headers=headers, **kw)

    @classmethod
    def text(cls, text: str, status: int = 200, **kw: Any) -> Reply:
        headers = [("content-type", "text/plain; charset=utf-8"), *kw.pop("headers", ())]
        return cls(status=status, body=text.encode(), headers=headers, **kw)


Route = Callable[[RecordedRequest], Reply]


class _Aborted(Exception):
    pass


@dataclass
class ScriptedServer:
    routes: dict[str, Route | list[Reply]] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    #: Requests whose client went away before the reply was sent (a cancelled call).
    disconnected: list[str] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def route(self, path: str, reply: Route | Reply | list[Reply]) -> None:
        if isinstance(reply, Reply):
            fixed = reply
            self.routes[path] = lambda _request: fixed
        else:
            self.routes[path] = reply

    def on(self, path: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == path]

    def _reply_for(self, request: RecordedRequest) -> Reply:
        route = self.routes.get(request.path)
        if route is None:
            return Reply.text("no such route", status=404)
        if isinstance(route, list):
            return route.pop(0) if len(route) > 1 else route[0]
        return route(request)

    async def __call__(self, scope: Mapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = RecordedRequest(
            method=scope["method"],
            path=scope["path"],
            query=scope["query_string"].decode(),
            headers={k.decode().lower(): v.decode() for k, v in scope["headers"]},
            body=body,
            received_at=time.monotonic(),
        )
        self.requests.append(request)
        reply = self._reply_for(request)
        if reply.delay and await self._client_left_within(receive, reply.delay):
            self.disconnected.append(request.path)
            return
        await self._send(send, reply)

    async def _client_left_within(self, receive: Any, seconds: float) -> bool:
        """Wait ``seconds``; True as soon as the client disconnects instead."""
        try:
            message = await asyncio.wait_for(receive(), timeout=seconds)
        except TimeoutError:
            return False
        return bool(message.get("type") == "http.disconnect")

    async def _send(self, send: Any, reply: Reply) -> None:
        headers = [(k.encode(), v.encode()) for k, v in reply.headers]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body, "more_body": True})
        for chunk in reply.chunks:
            if reply.chunk_delay:
                await asyncio.sleep(reply.chunk_delay)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if reply.abort:
            raise _Aborted("scripted abort")  # uvicorn closes the connection mid-response
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_scripted(start_timeout: float = 10.0) -> Iterator[ScriptedServer]:
    """Start a ScriptedServer on a free port; stop it (and its thread) on exit."""
    app = ScriptedServer(port=free_port())
    config = uvicorn.Config(
        app, host="127.0.0.1", port=app.port, lifespan="off", log_level="critical", loop="asyncio"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"scripted-{app.port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"scripted server on port {app.port} did not start")
        time.sleep(0.01)
    try:
        yield app
    finally:
        server.should_exit = True
        thread.join(timeout=10)
