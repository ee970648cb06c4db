"""The built-in components end to end: a real ``runq serve`` (each engine) configured with
``kind = "http"`` / ``"openai-chat"`` tables, calling real local servers, submitting over
HTTP like a sidecar's application does, and checking how each run settles."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from helpers import wait_for
from serve_harness import RunqServer, ServeFactory

from sidecar.sidecar_servers import Reply, ScriptedServer

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

LOCK_GRACE = 3.0
TOKEN = "Bearer e2e-token"


def config_for(app: ScriptedServer, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "queue": {"lock_grace_seconds": LOCK_GRACE, "poll_interval": 0.2, "max_attempts": 1},
        "routing": {"*": "local"},
        "components": {
            "task/render": {
                "kind": "http",
                "url": app.url + "/render",
                "timeout_seconds": 30,
                "headers": {"Authorization": "env:APP_TOKEN"},
                "poll": {"interval_seconds": 0.1},
            },
            "agent/summarize": {
                "kind": "openai-chat",
                "base_url": app.url + "/v1",
                "model": "fake-model",
                "api_key": "env:PROVIDER_KEY",
                "prices": {"prompt_per_1k": 1.0, "completion_per_1k": 2.0},
            },
        },
    }
    for section, values in extra.items():
        config[section] = {**config.get(section, {}), **values}
    return config


ENV = {"APP_TOKEN": TOKEN, "PROVIDER_KEY": "sk-e2e"}


async def start(serve_factory: ServeFactory, app: ScriptedServer, **extra: Any) -> RunqServer:
    return await serve_factory(config_for(app, **extra), env=ENV)


async def submit(server: RunqServer, component: str, payload: Any, **fields: Any) -> str:
    ctype, _, cid = component.partition("/")
    body = {"component_type": ctype, "component_id": cid, "payload": payload, **fields}
    response = await server.request("POST", "/runs", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["run_id"])


async def job(server: RunqServer, run_id: str) -> dict[str, Any]:
    response = await server.request("GET", f"/queue/jobs/{run_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def run_view(server: RunqServer, run_id: str) -> dict[str, Any]:
    response = await server.request("GET", f"/runs/{run_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def settled(
    server: RunqServer, run_id: str, statuses: tuple[str, ...], within: float = 20.0
) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        view = await job(server, run_id)
        return view if view["status"] in statuses else None

    result: dict[str, Any] = await wait_for(
        check, timeout=within, interval=0.1, message=f"run {run_id} becomes {statuses}"
    )
    return result


async def test_2xx_completes_with_the_answer_and_the_run_headers(
    serve_factory: ServeFactory, app_server: ScriptedServer
) -> None:
    app_server.route("/render", Reply.json({"html": "<h1>ok</h1>"}))
    server = await start(serve_factory, app_server)

    run_id = await submit(server, "task/render", {"doc": 42}, session_id="s-1")
    await settled(server, run_id, ("completed",))

    assert (await run_view(server, run_id))["answer"] == {"html": "<h1>ok</h1>"}
    [request] = app_server.on("/render")
    assert request.json() == {"doc": 42}
    assert request.headers["authorization"] == TOKEN
    assert request.headers["runq-run-id"] == run_id
    assert request.headers["runq-attempt"] == "1"
    assert request.headers["runq-session-id"] == "s-1"
    assert request.headers["idempotency-key"] == f"{run_id}:1"


async def test_4xx_fails_not_retryable(
    serve_factory: ServeFactory, app_server: ScriptedServer
) -> None:
    app_server.route("/render", Reply.json({"error": "unknown template"}, status=422))
    server = await start(serve_factory, app_server)

    run_id = await submit(server, "task/render", {}, max_attempts=3)
    view = await settled(server, run_id, ("failed",))

    assert view["termination_reason"] == "not_retryable"
    assert view["attempt"] == 1
    assert "answered 422" in view["error"]
    assert "unknown template" in view["error"]


async def test_429_schedules_the_retry_no_earlier_than_retry_after(
    serve_factory: ServeFactory, app_server: ScriptedServer
) -> None:
    app_server.route(
        "/render", Reply.text("slow down", status=429, headers=[("retry-after", "120")])
    )
    server = await start(serve_factory, app_server)

    run_id = await submit(server, "task/render", {}, max_attempts=3)

    async def retry_scheduled() -> dict[str, Any] | None:
        view = await job(server, run_id)
        return view if view["status"] == "queued" and view["attempt"] == 1 else None

    view = await wait_for(retry_scheduled, timeout=20, message="the retry is scheduled")
    assert "answered 429" in view["error"]
    # available_at is set by the failing write, at updated_at on the database clock.
    assert view["available_at"] - view["updated_at"] >= 119.0
    assert len(app_server.on("/render")) == 1


async def test_5xx_on_the_last_attempt_exhausts_retries(
    serve_factory: ServeFactory, app_server: ScriptedServer
) -> None:
    app_server.route("/render", Reply.text("boom", status=503, headers=[("retry-after", "0")]))
    server = await start(serve_factory, app_server)

    run_id = await submit(server, "task/render", {}, max_attempts=2)
    view = await settled(server, run_id, ("failed",))

    assert view["termination_reason"] == "retries_exhausted"
    assert view["attempt"] == 2
    attempts = [r.headers["runq-attempt"] for r in app_server.on("/render")]
    assert attempts == ["1", "2"]


async def test_pause_body_pauses_and_continue_sends_the_decision(
    serve_factory: ServeFactory, app_server: ScriptedServer
) -> None:
    def render(request: Any) -> Reply:
        if request.headers.get("runq-resume") == "1":
            envelope = request.json()
            return Reply.json({"published": envelope["resume"]["decision"]["approved"]})
        pause = {
            "reason": "approval",
            "state": {"draft": request.json()["doc"]},
            "summary": "Publish draft 7?",
        }
        return Reply.json({"runq": {"pause": pause}})

    app_server.route("/render", render)
    # The answer shows what the app received on resume; kept only when asked for.
    server = await start(serve_factory, app_server, privacy={"keep_answer_after_approval": True})

    run_id = await submit(server, "task/render", {"doc": 7})
    view = await settled(server, run_id, ("paused",))
    assert view["pause_reason"] == "approval"
    paused = await run_view(server, run_id)
    assert paused["pause"] == {"reason": "approval", "summary": "Publish draft 7?"}

    response = await server.request(
        "POST", f"/runs/{run_id}/continue", json={"decision": {"approved": True}}
    )
    assert response.status_code in (200, 202), response.text
    await settled(server, run_id, ("completed",))

    assert (await run_view(server, run_id))["answer"] == {"published": True}
    first, resumed = app_server.on("/render")
    assert resumed.json() == {
        "payload": {"doc": 7},
        "resume": {"state": {"draft": 7}, "decision": {"approved": True}},
    }
    assert resumed.headers["idempotency-key"] == f"{run_id}:2"
    assert first.headers["idempotency-key"] == f"{run_id}:1"


async def test_lease_is_kept_through_a_call_longer_than_lock_grace(
    serve_factory: ServeFactory, app_server: ScriptedServer
) -> None:
    call_seconds = 3 * LOCK_GRACE
    app_server.route("/render", Reply.json({"slow": "done"}, delay=call_seconds))
    server = await start(serve_factory, app_server)

    run_id = await submit(server, "task/render", {}, max_attempts=3)
    await wait_for(
        lambda: app_server.on("/render"), timeout=10, message="the call reaches the application"
    )
    # Past the grace, the lease is still fresh: the daemon's reaper (every poll_interval)
    # leaves the run alone, and so does an explicit reap pass afterwards.
    window_ends = time.monotonic() + 2 * LOCK_GRACE
    while time.monotonic() < window_ends:
        view = await job(server, run_id)
        assert (view["status"], view["attempt"]) == ("running", 1)
        assert time.time() - view["locked_at"] < LOCK_GRACE
        await anyio.sleep(0.25)  # sampling a window, not waiting for a condition
    reap = await server.setup.cli("reap", config=server.config_path)
    assert reap.returncode == 0, reap.stderr

    view = await settled(server, run_id, ("completed",), within=call_seconds + 10)
    assert view["attempt"] == 1
    assert len(app_server.on("/render")) == 1
    assert (await run_view(server, run_id))["answer"] == {"slow": "done"}


async def test_cancel_interrupts_the_call(
    serve_factory: ServeFactory, app_server: ScriptedServer
) -> None:
    app_server.route("/render", Reply.json({"never": True}, delay=60))
    server = await start(serve_factory, app_server)

    run_id = await submit(server, "task/render", {})
    await wait_for(
        lambda: app_server.on("/render"), timeout=10, message="the call reaches the application"
    )
    response = await server.request("POST", f"/runs/{run_id}/cancel")
    assert response.status_code in (200, 202), response.text

    await settled(server, run_id, ("cancelled",), within=10)
    await wait_for(
        lambda: app_server.disconnected == ["/render"],
        timeout=10,
        message="the application sees the cancelled call's connection close",
    )


async def test_openai_chat_records_usage_for_the_budget_gate(
    serve_factory: ServeFactory, app_server: ScriptedServer
) -> None:
    usage = {"prompt_tokens": 600, "completion_tokens": 400, "total_tokens": 1000}
    reply = {
        "choices": [{"message": {"role": "assistant", "content": "short summary"}}],
        "usage": usage,
    }
    app_server.route("/v1/chat/completions", Reply.json(reply))
    budget = {"limits": [{"scope": "user", "period": "day", "max_tokens": 1000}]}
    server = await start(serve_factory, app_server, budget=budget)

    first = await submit(server, "agent/summarize", {"prompt": "Summarise this."})
    await settled(server, first, ("completed",))
    assert (await run_view(server, first))["answer"] == "short summary"
    [call] = app_server.on("/v1/chat/completions")
    assert call.headers["authorization"] == "Bearer sk-e2e"
    assert call.json()["model"] == "fake-model"

    # The first run spent the day's 1000 tokens: the gate now keeps the next one queued.
    second = await submit(server, "agent/summarize", {"prompt": "And this."})
    await server.wait_for_claim_passes(5)  # passes that saw it and must not claim it
    view = await job(server, second)
    assert view["status"] == "queued"
    assert view["waiting"]["kind"] == "budget", view
    assert len(app_server.on("/v1/chat/completions")) == 1


async def test_openai_chat_provider_errors(
    serve_factory: ServeFactory, app_server: ScriptedServer
) -> None:
    error = {"error": {"message": "Incorrect API key", "code": "invalid_api_key"}}
    app_server.route("/v1/chat/completions", Reply.json(error, status=401))
    server = await start(serve_factory, app_server)

    run_id = await submit(server, "agent/summarize", "q", max_attempts=3)
    view = await settled(server, run_id, ("failed",))
    assert view["termination_reason"] == "not_retryable"
    assert "check api_key" in view["error"]
    assert "sk-e2e" not in view["error"]


async def test_a_bad_component_table_stops_the_start(
    serve_factory: ServeFactory, app_server: ScriptedServer
) -> None:
    config = config_for(app_server)
    config["components"]["task/render"]["headers"] = {"Authorization": "Bearer inline"}
    server = await serve_factory(config, env=ENV, wait_ready=False)
    code = await server.wait_exit(timeout=20)
    assert code != 0
    assert 'components."task/render".headers.Authorization' in server.logs()
