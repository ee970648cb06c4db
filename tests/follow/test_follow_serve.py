"""Following runs across real ``runq serve`` replicas, on both engines.

Replica A executes (it alone has deployment ``a``, and the runs ask for it); replica B only
answers HTTP for the same database. Everything a client reads from B was written by A.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import msgspec
import pytest
from helpers import wait_for
from serve_harness import (  # fixtures are used by name
    RunqSetup,
    ServeFactory,
    pg_ready,
    pg_serve_factory,
    pg_setup,
    runq_engine,
    runq_setup,
    serve_factory,
    sqlite_serve_factory,
    sqlite_setup,
)

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = [
    "pg_ready",
    "pg_serve_factory",
    "pg_setup",
    "runq_engine",
    "runq_setup",
    "serve_factory",
    "sqlite_serve_factory",
    "sqlite_setup",
]

COMPONENTS = {"task/emit": "follow.follow_handlers:emit"}
SETTLE = 30.0


def _config(setup: RunqSetup, deployment: str = "", **sections: Any) -> dict[str, Any]:
    route = "postgres" if setup.engine == "postgres" else "local"
    config: dict[str, Any] = {
        "queue": {"poll_interval": 0.1, "lock_grace_seconds": 3, "deployment_id": deployment},
        "routing": {"*": route},
        "components": COMPONENTS,
    }
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    return config


async def _submit(client: httpx.AsyncClient, base: str, payload: Any, **fields: Any) -> str:
    body = {"component_type": "task", "component_id": "emit", "payload": payload, **fields}
    response = await client.post(f"{base}/runs", json=body)
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    return run_id


def _frames(text: str) -> list[dict[str, str]]:
    """Parse SSE text into frames (comments dropped)."""
    frames = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if fields:
            frames.append(fields)
    return frames


async def _read_stream(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    stop_after: int = 0,
) -> list[dict[str, Any]]:
    """The events of one SSE connection; ``stop_after`` > 0 drops it after that many."""
    events: list[dict[str, Any]] = []
    buffer = ""
    async with client.stream("GET", url, headers=headers or {}) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for chunk in response.aiter_text():
            buffer += chunk
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                for frame in _frames(block + "\n\n"):
                    event = msgspec.json.decode(frame["data"])
                    assert frame["id"] == str(event["seq"])
                    assert frame["event"] == event["kind"]
                    events.append(event)
                    if stop_after and len(events) >= stop_after:
                        return events
    return events


async def test_a_run_on_replica_a_streams_to_a_client_of_replica_b_and_resumes(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    full = {"level": "full"}  # handler data stays after settle, to compare it whole
    a = await serve_factory(_config(runq_setup, deployment="a", privacy=full))
    b = await serve_factory(_config(runq_setup, deployment="b", privacy=full))
    async with httpx.AsyncClient(timeout=SETTLE) as client:
        run_id = await _submit(client, b.url, {"count": 120, "every": 0.02}, deployment_id="a")
        url = f"{b.url}/runs/{run_id}/events"
        first = await _read_stream(client, url, stop_after=20)
        resumed = await _read_stream(client, url, headers={"Last-Event-ID": str(first[-1]["seq"])})
    events = first + resumed
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    kinds = [e["kind"] for e in events]
    assert kinds[:2] == ["submitted", "claimed"]
    assert kinds[-1] == "completed"
    deltas = [e["data"]["i"] for e in events if e["kind"] == "delta"]
    assert deltas == list(range(120))
    claimed = events[1]["data"]
    assert claimed["worker"] != ""  # replica A's worker id
    assert a.url != b.url


async def test_json_page_and_after(runq_setup: RunqSetup, serve_factory: ServeFactory) -> None:
    server = await serve_factory(_config(runq_setup))
    async with httpx.AsyncClient(timeout=SETTLE) as client:
        run_id = await _submit(client, server.url, {"count": 5})
        done = await client.get(f"{server.url}/runs/{run_id}", params={"wait": 20})
        assert done.json()["status"] == "completed"
        page = await client.get(
            f"{server.url}/runs/{run_id}/events",
            params={"after": 2},
            headers={"Accept": "application/json"},
        )
        assert page.status_code == 200, page.text
        body = page.json()
        assert [e["seq"] for e in body["events"]] == [3, 4, 5, 6, 7, 8]
        assert body["final"] is True
        assert body["next_after"] == 8
        # Settled at the default privacy level (metadata): handler data is trimmed away
        # (right after the outcome is written).
        await _trimmed(client, server.url, run_id)
        again = await client.get(
            f"{server.url}/runs/{run_id}/events", params={"stream": "false", "after": 8}
        )
        assert again.json() == {"events": [], "next_after": 8, "final": False}
        # A finished run's stream replays and closes at once.
        streamed = await _read_stream(client, f"{server.url}/runs/{run_id}/events?after=6")
        assert [e["kind"] for e in streamed] == ["delta", "completed"]
        for bad in ({"after": "-1"}, {"wait": "61"}, {"after": "x"}):
            path = "events" if "after" in bad else ""
            r = await client.get(f"{server.url}/runs/{run_id}/{path}".rstrip("/"), params=bad)
            assert r.status_code == 400, (bad, r.status_code, r.text)
        r = await client.get(f"{server.url}/runs/{run_id}/events", headers={"Last-Event-ID": "abc"})
        assert r.status_code == 400


@pytest.mark.parametrize("level", ["full", "redacted", "metadata", "none"])
async def test_events_are_trimmed_at_settle_to_the_privacy_level(
    sqlite_serve_factory: ServeFactory, level: str
) -> None:
    """A completion trims in its own write: once the run reads completed, its events
    already obey the level (no wait for a later trim)."""
    setup = sqlite_serve_factory.setup
    server = await sqlite_serve_factory(_config(setup, privacy={"level": level}))
    text = "mail alice@example.com"
    async with httpx.AsyncClient(timeout=SETTLE) as client:
        run_id = await _submit(client, server.url, {"count": 2, "text": text})
        done = (await client.get(f"{server.url}/runs/{run_id}", params={"wait": 20})).json()
        assert done["status"] == "completed"
        page = (await client.get(f"{server.url}/runs/{run_id}/events?stream=false")).json()
    delta = next(e for e in page["events"] if e["kind"] == "delta")
    claimed = next(e for e in page["events"] if e["kind"] == "claimed")
    expected_delta = {
        "full": {"i": 0, "text": text},
        "redacted": {"i": 0, "text": "mail [redacted]"},
        "metadata": None,
        "none": None,
    }[level]
    assert delta["data"] == expected_delta
    assert (claimed["data"] is None) is (level == "none")


async def test_a_paused_runs_events_survive_a_restart(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    server = await serve_factory(_config(runq_setup))
    async with httpx.AsyncClient(timeout=SETTLE) as client:
        run_id = await _submit(client, server.url, {"count": 3, "text": "kept", "pause": True})
        paused = await client.get(f"{server.url}/runs/{run_id}", params={"wait": 20})
        assert paused.json()["status"] == "paused"
        await server.restart()
        page = (await client.get(f"{server.url}/runs/{run_id}/events?stream=false")).json()
        kinds = [e["kind"] for e in page["events"]]
        assert kinds == ["submitted", "claimed", "delta", "delta", "delta", "paused"]
        assert page["events"][2]["data"] == {"i": 0, "text": "kept"}
        assert page["events"][-1]["data"] == {"reason": "approval"}
        await client.post(f"{server.url}/runs/{run_id}/continue", json={"decision": "ok"})
        final = await client.get(f"{server.url}/runs/{run_id}", params={"wait": 20})
        assert final.json()["status"] == "completed"
        await _trimmed(client, server.url, run_id)
        page = (await client.get(f"{server.url}/runs/{run_id}/events?stream=false")).json()
    kinds = [e["kind"] for e in page["events"]]
    assert kinds[6:] == ["continued", "claimed", "delta", "delta", "delta", "completed"]


async def test_wait_answers_promptly_after_the_outcome(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    a = await serve_factory(_config(runq_setup, deployment="a"))
    b = await serve_factory(_config(runq_setup, deployment="b"))
    async with httpx.AsyncClient(timeout=SETTLE) as client:
        run_id = await _submit(client, a.url, {"count": 1, "every": 1.0}, deployment_id="a")
        started = time.monotonic()
        response = await client.get(f"{b.url}/runs/{run_id}", params={"wait": 30})
        waited = time.monotonic() - started
        assert response.json()["status"] == "completed"
        assert waited < 10, waited  # the run takes ~1 s; the deadline is generous
        run_id = await _submit(client, a.url, {"count": 0, "every": 0}, deployment_id="a")
        await client.get(f"{b.url}/runs/{run_id}", params={"wait": 30})
        completed_at = (await client.get(f"{b.url}/runs/{run_id}")).json()["completed_at"]
        assert completed_at is not None
        slow = await _submit(client, a.url, {"count": 1, "every": 30}, deployment_id="a")
        started = time.monotonic()
        response = await client.get(f"{b.url}/runs/{slow}", params={"wait": 1})
        assert response.json()["status"] in ("queued", "running")
        assert 0.9 <= time.monotonic() - started < 10
        await client.post(f"{b.url}/runs/{slow}/cancel")


async def test_runq_jobs_wait_exit_codes_and_events(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    server = await serve_factory(_config(runq_setup))
    config = runq_setup.write_config(_config(runq_setup))
    async with httpx.AsyncClient(timeout=SETTLE) as client:
        done = await _submit(client, server.url, {"count": 2})
        paused = await _submit(client, server.url, {"count": 0, "pause": True})
        slow = await _submit(client, server.url, {"count": 1, "every": 30})
        failed = (
            await client.post(
                f"{server.url}/runs",
                json={"component_type": "task", "component_id": "fail", "payload": {}},
            )
        ).json()["run_id"]
        await wait_for(
            lambda: _status(client, server.url, slow),
            timeout=SETTLE,
            message="the slow run never started",
        )
    expected = {done: 0, failed: 1, paused: 3, slow: 4, "0190f1c2-0000-7000-8000-000000000000": 2}
    for run_id, code in expected.items():
        result = await runq_setup.cli(
            "jobs", "wait", run_id, "--timeout", "1", "--json", config=config
        )
        assert result.returncode == code, (run_id, result.stdout, result.stderr)
    result = await runq_setup.cli("jobs", "events", done, "--follow", "--json", config=config)
    assert result.returncode == 0, result.stderr
    lines = [msgspec.json.decode(line) for line in result.stdout.splitlines()]
    assert [e["kind"] for e in lines] == ["submitted", "claimed", "delta", "delta", "completed"]
    result = await runq_setup.cli("jobs", "events", done, config=config)
    assert result.returncode == 0
    assert "completed" in result.stdout


async def _status(client: httpx.AsyncClient, base: str, run_id: str) -> bool:
    return bool((await client.get(f"{base}/runs/{run_id}")).json()["status"] == "running")


async def _trimmed(client: httpx.AsyncClient, base: str, run_id: str) -> None:
    """Wait until no handler event of the run keeps data (trimmed after its outcome)."""

    async def no_data() -> bool:
        page = (await client.get(f"{base}/runs/{run_id}/events?stream=false")).json()
        return all(e["data"] is None for e in page["events"] if e["kind"] == "delta")

    await wait_for(no_data, timeout=SETTLE, message="the events were never trimmed")
