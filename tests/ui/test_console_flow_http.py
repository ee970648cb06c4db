"""The new console routes' rules over plain HTTP, against a real ``runq serve``: forged
schedule and pause forms change nothing, hostile names are a clear 404, the operator pages
need the admin scope, and a run's timeline stream has the API's visibility."""

from __future__ import annotations

import pytest
from serve_harness import (  # fixtures are used by name
    RunqServer,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)
from test_console_http import hidden_field, signed_in
from ui_support import bearer, console_config, mint, server_env, submit, wait_status

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]

NIGHTLY = {"name": "nightly", "cron": "0 3 * * *", "component": "task/echo"}


async def start(serve_factory: ServeFactory, auth: str = "key") -> RunqServer:
    config = console_config(auth)
    config["schedules"] = [NIGHTLY]
    return await serve_factory(config, env=server_env())


async def _paused(server: RunqServer, credential: str | None = None) -> bool:
    headers = bearer(credential) if credential else bearer()
    listed = await server.request("GET", "/queue/schedules/", headers=headers)
    assert listed.status_code == 200, listed.text
    paused: bool = listed.json()[0]["paused"]
    return paused


async def test_schedule_and_pause_forms_need_the_csrf_token(
    serve_factory: ServeFactory, runq_engine: str
) -> None:
    server = await start(serve_factory)
    added = await server.request(
        "POST", "/queue/pauses/", json={"deployment": "gpu"}, headers=bearer()
    )
    pause_id = added.json()["id"]
    async with signed_in(server) as client:
        page = await client.get("/ui/queue/schedules")
        assert page.status_code == 200
        csrf = hidden_field(page.text, "csrf")

        assert (await client.post("/ui/queue/schedules/nightly/pause", data={})).status_code == 403
        forged = await client.post(
            "/ui/queue/schedules/nightly/pause",
            data={"csrf": csrf},
            headers={"Origin": "https://evil.example"},
        )
        assert forged.status_code == 403
        assert not await _paused(server)
        remove = f"/ui/queue/pauses/{pause_id}/remove"
        assert (await client.post(remove, data={"csrf": "0" * 64})).status_code == 403
        pauses = await server.request("GET", "/queue/pauses/", headers=bearer())
        assert [p["id"] for p in pauses.json()["data"]] == [pause_id]

        paused = await client.post("/ui/queue/schedules/nightly/pause", data={"csrf": csrf})
        assert paused.status_code == 303
        assert paused.headers["location"] == "/ui/queue/schedules?done=schedule_paused"
        assert await _paused(server)
        resumed = await client.post("/ui/queue/schedules/nightly/resume", data={"csrf": csrf})
        assert resumed.status_code == 303
        assert not await _paused(server)

        removed = await client.post(remove, data={"csrf": csrf})
        assert removed.status_code == 303
        again = await client.post(remove, data={"csrf": csrf})
        assert again.status_code == 404

        for name in ("no-such-schedule", "x" * 5000, "%00"):
            response = await client.post(f"/ui/queue/schedules/{name}/pause", data={"csrf": csrf})
            assert response.status_code == 404, (name, response.status_code)
            assert "text/html" in response.headers["content-type"]
        gone = await client.post(f"/ui/queue/pauses/{'y' * 5000}/remove", data={"csrf": csrf})
        assert gone.status_code == 404


async def test_operator_pages_need_the_admin_scope_and_timelines_follow_visibility(
    serve_factory: ServeFactory, runq_engine: str
) -> None:
    server = await start(serve_factory, auth="jwt")
    alice, bob = mint("alice"), mint("bob")
    hers = await submit(server, "task/echo", {"x": 1}, credential=alice)
    await wait_status(server, hers, "completed", credential=alice)
    async with signed_in(server, bob) as client:
        for path in ("/ui/queue/schedules", "/ui/queue/limits", "/ui/queue/jobs/live"):
            assert (await client.get(path)).status_code == 403, path
        assert (await client.get(f"/ui/runs/{hers}/events")).status_code == 404
    async with signed_in(server, alice) as client:
        # Her own run's log, ended: the stream replays it up to the final event and closes.
        async with client.stream("GET", f"/ui/runs/{hers}/events") as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            body = (await stream.aread()).decode()
        assert "event: timeline" in body
        assert '"kind":"completed"' in body
        assert (await client.get(f"/ui/runs/{hers}/events?after=abc")).status_code == 400
