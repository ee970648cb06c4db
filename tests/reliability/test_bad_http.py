"""Bad input at scale over HTTP: oversized and slow requests, and the API fuzz run long.

While well-behaved clients submit runs, attackers send

* bodies larger than ``[http] max_body_bytes``, announced (``Content-Length``) and streamed
  (chunked): answered 413, the stream cut off long before it ends;
* slow bodies (headers, then a byte now and then), slow headers, and connections that send
  nothing at all: each cut off (408 where a request was under way) within
  ``[http] request_timeout_seconds`` plus a margin, never held open for good;

and the well-behaved clients notice nothing: no error, no refusal, bounded latency, and
the daemon stays up without a traceback. The ``long`` variant runs many more attackers for
longer, and runs the schemathesis fuzz of ``tests/api/test_api_fuzz.py`` with ten times
as many examples per operation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream
from serve_harness import RunqServer, ServeFactory

from reliability.clients import LoadStats, percentile, run_clients

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

MAX_BODY = 65536
REQUEST_TIMEOUT = 2.0
#: How much later than the request timeout a cut-off may come (a loaded 2-core machine).
CUT_MARGIN = 3.0


@dataclass(frozen=True)
class Attack:
    slow: int
    seconds: float


SHORT = Attack(slow=20, seconds=8.0)
LONG = Attack(slow=300, seconds=60.0)


@dataclass
class Observed:
    oversized: list[str] = field(default_factory=list)
    streamed: list[str] = field(default_factory=list)
    cut_after: dict[str, list[float]] = field(default_factory=dict)
    answers: dict[str, list[str]] = field(default_factory=dict)

    def cut(self, kind: str, seconds: float, first_line: str) -> None:
        self.cut_after.setdefault(kind, []).append(seconds)
        self.answers.setdefault(kind, []).append(first_line)


async def connect(server: RunqServer) -> SocketStream:
    host, port = server.listen.rsplit(":", 1)
    return await anyio.connect_tcp(host, int(port))


async def read_until_closed(stream: SocketStream, limit: float) -> bytes:
    data = b""
    with anyio.move_on_after(limit):
        try:
            while True:
                data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
            pass
    return data


def first_line(data: bytes) -> str:
    return data.split(b"\r\n", 1)[0].decode("latin-1") if data else "(closed, no answer)"


POST = b"POST /runs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"


async def oversized_announced(server: RunqServer, seen: Observed) -> None:
    async with await connect(server) as stream:
        await stream.send(POST + b"Content-Length: %d\r\n\r\n" % (50 * MAX_BODY))
        await stream.send(b"{" + b" " * 4096)
        data = await read_until_closed(stream, limit=15)
    seen.oversized.append(first_line(data))


async def oversized_streamed(server: RunqServer, seen: Observed) -> None:
    """A chunked body that would never end: the server must answer and stop reading."""
    sent = 0
    answer = b""
    async with await connect(server) as stream:
        await stream.send(POST + b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (16384, b" " * 16384)
        try:
            with anyio.move_on_after(15):
                while sent < 64 * MAX_BODY:
                    await stream.send(chunk)
                    sent += 16384
                    with anyio.move_on_after(0.001):
                        answer += await stream.receive()
                    if answer:
                        break
        except (anyio.BrokenResourceError, anyio.EndOfStream, ConnectionError):
            pass
        if not answer:
            answer = await read_until_closed(stream, limit=5)
    seen.streamed.append(f"{first_line(answer)} after {sent} bytes")


async def slow_client(server: RunqServer, seen: Observed, kind: str, stop_after: float) -> None:
    """``body``: headers, then a body byte every 0.5 s; ``headers``: a header line every
    0.5 s; ``idle``: connect and send nothing. Records when the server cut it off."""
    started = time.monotonic()
    async with await connect(server) as stream:
        try:
            if kind == "body":
                await stream.send(POST + b"Content-Length: 1000\r\n\r\n{")
            elif kind == "headers":
                await stream.send(b"POST /runs HTTP/1.1\r\n")
            data = b""
            with anyio.move_on_after(stop_after):
                while True:
                    with anyio.move_on_after(0.5):
                        data += await stream.receive()
                        if data:
                            data += await read_until_closed(stream, limit=2)
                            break
                    if kind == "body":
                        await stream.send(b" ")
                    elif kind == "headers":
                        await stream.send(b"X-Slow: 1\r\n")
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
            pass
    seen.cut(kind, time.monotonic() - started, first_line(data))


@pytest.mark.parametrize(
    "attack",
    [pytest.param(SHORT, id="short"), pytest.param(LONG, id="long", marks=pytest.mark.long)],
)
async def test_oversized_and_slow_requests_are_cut_off_and_harm_nobody(
    attack: Attack, sqlite_serve_factory: ServeFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    server = await sqlite_serve_factory(
        {
            "queue": {"poll_interval": 0.5, "max_queue_depth": 0},
            "routing": {"*": "local"},
            "http": {"max_body_bytes": MAX_BODY, "request_timeout_seconds": REQUEST_TIMEOUT},
        }
    )
    good = LoadStats()
    seen = Observed()
    stop = anyio.Event()
    stop_after = REQUEST_TIMEOUT + CUT_MARGIN + 5  # a client never cut off gives up here
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: run_clients(
                lambda: server.url, good, stop, clients=8, pause=0.02, key_prefix="good"
            )
        )
        deadline = time.monotonic() + attack.seconds
        async with anyio.create_task_group() as attackers:
            while time.monotonic() < deadline:
                for _ in range(3):
                    attackers.start_soon(oversized_announced, server, seen)
                    attackers.start_soon(oversized_streamed, server, seen)
                for i in range(attack.slow):
                    kind = ("body", "headers", "idle")[i % 3]
                    attackers.start_soon(slow_client, server, seen, kind, stop_after)
                await anyio.sleep(min(stop_after, max(deadline - time.monotonic(), 0)))
        stop.set()

    assert seen.oversized
    assert all(line.startswith("HTTP/1.1 413") for line in seen.oversized), seen.oversized[:5]
    assert all(line.startswith("HTTP/1.1 413") for line in seen.streamed), seen.streamed[:5]
    for kind in ("body", "headers", "idle"):
        times = seen.cut_after.get(kind, [])
        assert times, f"no {kind} attacker ran"
        slowest = max(times)
        assert slowest <= REQUEST_TIMEOUT + CUT_MARGIN, (
            f"a slow-{kind} client was held {slowest:.1f}s (timeout {REQUEST_TIMEOUT:g}s)"
        )
    assert all(line.startswith("HTTP/1.1 408") for line in seen.answers["body"]), seen.answers[
        "body"
    ][:5]

    # The well-behaved clients noticed nothing.
    assert not good.errors, good.errors
    assert set(good.statuses) == {"202"}, (good.statuses, good.bodies[:5])
    p99 = percentile(good.submit_latency, 99)
    assert p99 < 2.0, f"well-behaved submit p99 {p99:.2f}s under attack"
    assert (await server.request("GET", "/healthz")).status_code == 200
    assert server.returncode is None
    assert "Traceback" not in server.logs()
    with capsys.disabled():
        cut = {k: f"max {max(v):.1f}s" for k, v in seen.cut_after.items()}
        print(
            f"\nbad HTTP: {len(seen.oversized)} oversized (413), {len(seen.streamed)} endless "
            f"chunked bodies ({seen.streamed[0]}), slow clients cut off: {cut}; "
            f"well-behaved: {len(good.acked)} submissions, p99 {p99 * 1000:.0f} ms, no error"
        )


@pytest.mark.long
async def test_the_api_fuzz_run_long(
    serve_factory: ServeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tests/api/test_api_fuzz.py`` with ten times the examples per operation and mode."""
    api_dir = Path(__file__).resolve().parents[1] / "api"
    monkeypatch.syspath_prepend(str(api_dir))
    import test_api_fuzz as api_fuzz

    monkeypatch.setattr(api_fuzz, "EXAMPLES_PER_OPERATION", api_fuzz.EXAMPLES_PER_OPERATION * 10)
    fuzz = api_fuzz.test_fuzz_finds_no_server_error_and_no_schema_violation
    await fuzz(serve_factory)
