"""``kind = "http"`` against a real local HTTP server: request contract, answers, failure
classification, Retry-After, timeouts, lease renewal, size limit, pause, resume, polling."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from helpers import wait_for

from runq.errors import ConfigError, PauseRequested, Permanent, Retryable
from runq.model import Resume
from runq.sidecar.http_calls import parse_retry_after
from runq.sidecar.http_component import build_http_component, read_settings
from sidecar.sidecar_fakes import FakeHooks, make_ctx
from sidecar.sidecar_servers import Reply, ScriptedServer, free_port

pytestmark = pytest.mark.anyio

NAME = "task/render"


def component(server: ScriptedServer, path: str = "/render", **spec: Any) -> Any:
    return build_http_component(NAME, {"kind": "http", "url": server.url + path, **spec})


async def call(handler: Any, payload: Any = None, **ctx_kw: Any) -> tuple[Any, FakeHooks]:
    ctx, hooks = make_ctx(**ctx_kw)
    return await handler(ctx, payload), hooks


# -- the request ---------------------------------------------------------------------------


async def test_request_carries_payload_run_headers_and_configured_headers(
    app_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APP_TOKEN", "Bearer s3cret")
    app_server.route("/render", Reply.json({"ok": True}))
    handler = component(
        app_server, headers={"Authorization": "env:APP_TOKEN", "Accept": "application/json"}
    )

    answer, _ = await call(handler, {"doc": 42}, attempt=3)

    assert answer == {"ok": True}
    [request] = app_server.on("/render")
    assert request.method == "POST"
    assert request.json() == {"doc": 42}
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == "Bearer s3cret"
    assert request.headers["accept"] == "application/json"
    run_id = "0191e0c4-0000-7000-8000-000000000001"
    assert request.headers["runq-run-id"] == run_id
    assert request.headers["runq-attempt"] == "3"
    assert request.headers["runq-session-id"] == "session-7"
    assert request.headers["runq-user-id"] == "alice"
    assert request.headers["runq-component"] == NAME
    assert request.headers["idempotency-key"] == f"{run_id}:3"
    assert "runq-resume" not in request.headers


async def test_no_session_header_without_a_session_and_put_method(
    app_server: ScriptedServer,
) -> None:
    app_server.route("/render", Reply.json(1))
    answer, _ = await call(component(app_server, method="put"), None, session_id=None)
    assert answer == 1
    [request] = app_server.requests
    assert request.method == "PUT"
    assert request.body == b"null"
    assert "runq-session-id" not in request.headers


async def test_a_continued_run_sends_the_resume_envelope(app_server: ScriptedServer) -> None:
    app_server.route("/render", Reply.json({"published": True}))
    resume = Resume(state={"draft": 7}, decision={"approved": True})

    answer, _ = await call(component(app_server), {"doc": 1}, resume=resume)

    assert answer == {"published": True}
    [request] = app_server.requests
    assert request.headers["runq-resume"] == "1"
    assert request.json() == {
        "payload": {"doc": 1},
        "resume": {"state": {"draft": 7}, "decision": {"approved": True}},
    }


# -- answers ---------------------------------------------------------------------------------


async def test_text_answer_keeps_the_text(app_server: ScriptedServer) -> None:
    app_server.route("/render", Reply.text("rendered ✓"))
    answer, _ = await call(component(app_server), {})
    assert answer == "rendered ✓"


async def test_json_suffix_media_type_is_decoded(app_server: ScriptedServer) -> None:
    body = b'{"title": "x"}'
    app_server.route("/render", Reply(body=body, headers=[("content-type", "application/ld+json")]))
    answer, _ = await call(component(app_server), {})
    assert answer == {"title": "x"}


async def test_empty_2xx_answers_none(app_server: ScriptedServer) -> None:
    app_server.route("/render", Reply(status=204))
    answer, _ = await call(component(app_server), {})
    assert answer is None


async def test_json_content_type_with_a_broken_body_is_permanent(
    app_server: ScriptedServer,
) -> None:
    app_server.route(
        "/render", Reply(body=b"{nope", headers=[("content-type", "application/json")])
    )
    with pytest.raises(Permanent, match="not JSON"):
        await call(component(app_server), {})


# -- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504])
async def test_retryable_statuses(app_server: ScriptedServer, status: int) -> None:
    app_server.route("/render", Reply.text("busy, try later", status=status))
    with pytest.raises(Retryable) as info:
        await call(component(app_server), {})
    assert str(status) in str(info.value)
    assert "busy, try later" in str(info.value)
    assert info.value.retry_after is None
    assert not isinstance(info.value, Permanent)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 409, 410, 413, 422])
async def test_permanent_statuses(app_server: ScriptedServer, status: int) -> None:
    app_server.route("/render", Reply.json({"error": "bad input"}, status=status))
    with pytest.raises(Permanent) as info:
        await call(component(app_server), {})
    assert f"answered {status}" in str(info.value)
    assert "bad input" in str(info.value)


async def test_retry_after_seconds_is_the_earliest_next_attempt(
    app_server: ScriptedServer,
) -> None:
    app_server.route(
        "/render", Reply.text("slow down", status=429, headers=[("retry-after", "17")])
    )
    with pytest.raises(Retryable) as info:
        await call(component(app_server), {})
    assert info.value.retry_after == 17.0


async def test_retry_after_http_date(app_server: ScriptedServer) -> None:
    when = datetime.now(UTC) + timedelta(seconds=120)
    header = format_datetime(when, usegmt=True)
    app_server.route("/render", Reply.text("down", status=503, headers=[("retry-after", header)]))
    with pytest.raises(Retryable) as info:
        await call(component(app_server), {})
    assert info.value.retry_after is not None
    assert 110 <= info.value.retry_after <= 121


def test_parse_retry_after_forms() -> None:
    now = 1_700_000_000.0
    date = format_datetime(datetime.fromtimestamp(now + 30, UTC), usegmt=True)
    assert parse_retry_after(httpx.Headers({"retry-after": "5"})) == 5.0
    assert parse_retry_after(httpx.Headers({"retry-after": "1.5"})) == 1.5
    assert parse_retry_after(httpx.Headers({"retry-after": date}), now=now) == 30.0
    past = format_datetime(datetime.fromtimestamp(now - 30, UTC), usegmt=True)
    assert parse_retry_after(httpx.Headers({"retry-after": past}), now=now) == 0.0
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "250"})) == 0.25
    assert parse_retry_after(httpx.Headers({"retry-after": "soon"})) is None
    assert parse_retry_after(httpx.Headers({"retry-after": "-3"})) is None
    assert parse_retry_after(httpx.Headers({})) is None


async def test_connection_refused_is_retryable() -> None:
    handler = build_http_component(
        NAME, {"kind": "http", "url": f"http://127.0.0.1:{free_port()}/render"}
    )
    with pytest.raises(Retryable, match="failed"):
        await call(handler, {})


async def test_connection_broken_mid_response_is_retryable(app_server: ScriptedServer) -> None:
    app_server.route(
        "/render",
        Reply(body=b'{"partial": ', headers=[("content-length", "100")], abort=True),
    )
    with pytest.raises(Retryable):
        await call(component(app_server), {})


async def test_timeout_is_retryable(app_server: ScriptedServer) -> None:
    app_server.route("/render", Reply.json({"late": True}, delay=5))
    started = time.monotonic()
    with pytest.raises(Retryable, match="timed out"):
        await call(component(app_server, timeout_seconds=0.5), {})
    assert time.monotonic() - started < 3


async def test_redirect_is_refused_unless_allowed(app_server: ScriptedServer) -> None:
    app_server.route("/render", Reply(status=307, headers=[("location", "/elsewhere")]))
    app_server.route("/elsewhere", Reply.json({"moved": True}))

    with pytest.raises(Permanent, match="follow_redirects"):
        await call(component(app_server), {})
    assert app_server.on("/elsewhere") == []

    answer, _ = await call(component(app_server, follow_redirects=True), {"x": 1})
    assert answer == {"moved": True}
    assert app_server.on("/elsewhere")[0].json() == {"x": 1}  # 307 keeps method and body


# -- size limit ------------------------------------------------------------------------------


async def test_declared_oversized_response_is_refused(app_server: ScriptedServer) -> None:
    app_server.route("/render", Reply.text("x" * 5000))
    with pytest.raises(Permanent, match="larger than 1024 bytes"):
        await call(component(app_server, max_response_bytes=1024), {})


async def test_streamed_oversized_response_is_refused_while_reading(
    app_server: ScriptedServer,
) -> None:
    # No Content-Length (chunked): the limit must stop the read, not a header check.
    app_server.route(
        "/render",
        Reply(
            body=b"[",
            chunks=[b"1," * 400] * 50,
            headers=[("content-type", "application/json")],
        ),
    )
    with pytest.raises(Permanent, match="larger than 2048 bytes"):
        await call(component(app_server, max_response_bytes=2048), {})


async def test_response_at_the_limit_is_accepted(app_server: ScriptedServer) -> None:
    app_server.route("/render", Reply.text("y" * 1024))
    answer, _ = await call(component(app_server, max_response_bytes=1024), {})
    assert answer == "y" * 1024


# -- lease and cancel --------------------------------------------------------------------
# The lease itself is renewed by the worker's heartbeat (shown end to end in
# test_sidecar_e2e.py); the handler asks for a renewal before its call, and a cancel
# arrives as a cancelled scope, which must stop the call and close its connection.


async def test_a_renewal_is_asked_for_before_the_call(app_server: ScriptedServer) -> None:
    app_server.route("/render", Reply.json({"done": True}))
    _, hooks = await call(component(app_server), {})
    assert hooks.renewals_asked == 1


async def test_a_cancelled_scope_interrupts_the_call_and_closes_it(
    app_server: ScriptedServer,
) -> None:
    app_server.route("/render", Reply.json({"never": True}, delay=30))
    ctx, _ = make_ctx()
    handler = component(app_server)
    started = time.monotonic()
    with anyio.move_on_after(1.0) as scope:
        await handler(ctx, {})
    assert scope.cancelled_caught
    assert time.monotonic() - started < 3
    await wait_for(
        lambda: app_server.disconnected == ["/render"],
        timeout=5,
        message="the application sees the cancelled call's connection close",
    )


# -- pause -----------------------------------------------------------------------------------


async def test_pause_body_pauses_the_run(app_server: ScriptedServer) -> None:
    pause = {"runq": {"pause": {"reason": "approval", "state": {"draft": 7}}}}
    app_server.route("/render", Reply.json(pause))
    with pytest.raises(PauseRequested) as info:
        await call(component(app_server), {})
    assert info.value.pause_reason == "approval"
    assert info.value.state == {"draft": 7}


@pytest.mark.parametrize(
    "body",
    [
        {"runq": {"pause": {"state": {}}}},
        {"runq": {"pause": "approval"}},
        {"runq": {"paus": {"reason": "x"}}},
        {"runq": {"pause": {"reason": "  "}}},
    ],
)
async def test_malformed_pause_body_is_permanent(app_server: ScriptedServer, body: Any) -> None:
    app_server.route("/render", Reply.json(body))
    with pytest.raises(Permanent, match="pause"):
        await call(component(app_server), {})


# -- 202 + Location polling ------------------------------------------------------------------


def accepted(location: str = "/jobs/1", extra: tuple[tuple[str, str], ...] = ()) -> Reply:
    headers = [("location", location), *extra]
    return Reply.json({"accepted": True}, status=202, headers=headers)


async def test_202_is_polled_until_final(app_server: ScriptedServer) -> None:
    app_server.route("/render", accepted())
    app_server.route("/jobs/1", [accepted(), accepted(), Reply.json({"result": "done"})])
    handler = component(app_server, poll={"interval_seconds": 0.05})

    answer, _ = await call(handler, {"doc": 1})

    assert answer == {"result": "done"}
    polls = app_server.on("/jobs/1")
    assert len(polls) == 3
    assert all(p.method == "GET" for p in polls)
    assert polls[0].headers["idempotency-key"].endswith(":1")


async def test_poll_result_may_pause(app_server: ScriptedServer) -> None:
    app_server.route("/render", accepted())
    app_server.route("/jobs/1", Reply.json({"runq": {"pause": {"reason": "input"}}}))
    with pytest.raises(PauseRequested) as info:
        await call(component(app_server, poll={"interval_seconds": 0.05}), {})
    assert info.value.pause_reason == "input"
    assert info.value.state is None


async def test_poll_follows_303_to_the_result(app_server: ScriptedServer) -> None:
    app_server.route("/render", accepted())
    app_server.route("/jobs/1", Reply(status=303, headers=[("location", "/results/1")]))
    app_server.route("/results/1", Reply.text("the result"))
    answer, _ = await call(component(app_server, poll={"interval_seconds": 0.05}), {})
    assert answer == "the result"


async def test_poll_rides_out_transient_failures(app_server: ScriptedServer) -> None:
    app_server.route("/render", accepted())
    app_server.route(
        "/jobs/1",
        [Reply.text("restarting", status=503), Reply.json({"result": 2})],
    )
    answer, _ = await call(component(app_server, poll={"interval_seconds": 0.05}), {})
    assert answer == {"result": 2}
    assert len(app_server.on("/render")) == 1  # the work was not started twice


async def test_poll_stops_on_a_permanent_status(app_server: ScriptedServer) -> None:
    app_server.route("/render", accepted())
    app_server.route("/jobs/1", Reply.text("gone", status=410))
    with pytest.raises(Permanent, match="410"):
        await call(component(app_server, poll={"interval_seconds": 0.05}), {})


async def test_poll_gives_up_after_max_seconds(app_server: ScriptedServer) -> None:
    app_server.route("/render", accepted())
    app_server.route("/jobs/1", accepted())
    handler = component(app_server, poll={"interval_seconds": 0.1, "max_seconds": 0.5})
    with pytest.raises(Retryable, match=r"poll\.max_seconds"):
        await call(handler, {})


async def test_poll_honours_retry_after_on_202(app_server: ScriptedServer) -> None:
    app_server.route("/render", accepted(extra=(("retry-after", "1"),)))
    app_server.route("/jobs/1", Reply.json("ok"))
    answer, _ = await call(component(app_server, poll={"interval_seconds": 0.01}), {})
    assert answer == "ok"
    [post] = app_server.on("/render")
    [poll] = app_server.on("/jobs/1")
    assert poll.received_at - post.received_at >= 0.9


async def test_poll_refuses_another_origin(app_server: ScriptedServer) -> None:
    app_server.route("/render", accepted(location="http://example.invalid/jobs/1"))
    with pytest.raises(Permanent, match="origin"):
        await call(component(app_server, poll={"interval_seconds": 0.05}), {})


async def test_202_without_polling_completes_with_its_body(app_server: ScriptedServer) -> None:
    app_server.route("/render", accepted())
    answer, _ = await call(component(app_server, poll={"enabled": False}), {})
    assert answer == {"accepted": True}
    assert app_server.on("/jobs/1") == []


# -- configuration ---------------------------------------------------------------------------


def build(spec: dict[str, Any]) -> Any:
    return build_http_component(NAME, {"kind": "http", **spec})


URL = "http://127.0.0.1:9/render"


@pytest.mark.parametrize(
    ("spec", "key", "reason"),
    [
        ({}, '"task/render".url', "required"),
        ({"url": "ftp://host/x"}, '"task/render".url', "http"),
        ({"url": "/relative"}, '"task/render".url', "http"),
        ({"url": URL, "method": "GET"}, '"task/render".method', "POST"),
        ({"url": URL, "timeout_seconds": 0}, '"task/render".timeout_seconds', "> 0"),
        ({"url": URL, "max_response_bytes": 0}, '"task/render".max_response_bytes', ">= 1"),
        ({"url": URL, "follow_redirects": "yes"}, '"task/render".follow_redirects', "true"),
        ({"url": URL, "timeout": 3}, '"task/render".timeout', "unknown key"),
        ({"url": URL, "poll": {"interval_seconds": -1}}, "poll.interval_seconds", "> 0"),
        ({"url": URL, "poll": {"every": 1}}, '"task/render".poll.every', "unknown key"),
        ({"url": URL, "poll": 5}, '"task/render".poll', "table"),
        ({"url": URL, "headers": {"Authorization": "Bearer abc"}}, "Authorization", "env:"),
        ({"url": URL, "headers": {"X-Api-Key": "abc"}}, "X-Api-Key", "env:"),
        ({"url": URL, "headers": {"Runq-Run-Id": "x"}}, "Runq-Run-Id", "set by runq"),
        ({"url": URL, "headers": {"Idempotency-Key": "x"}}, "Idempotency-Key", "set by runq"),
        ({"url": URL, "headers": {"Bad Name": "x"}}, "Bad Name", "header name"),
        ({"url": URL, "headers": {"Accept": 3}}, "headers.Accept", "string"),
        (
            {"url": URL, "headers": {"Authorization": "env:RUNQ_TEST_SURELY_UNSET"}},
            "Authorization",
            "RUNQ_TEST_SURELY_UNSET is not set",
        ),
    ],
)
def test_bad_config_names_the_key(spec: dict[str, Any], key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(spec)
    assert key in info.value.key
    assert info.value.key.startswith('components."task/render"')
    assert reason in str(info.value)


def test_url_and_header_values_from_a_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("Bearer from-file\n")
    url = tmp_path / "url"
    url.write_text(URL)
    spec = {"kind": "http", "url": f"file:{url}", "headers": {"Authorization": f"file:{token}"}}
    settings = read_settings(NAME, spec)
    assert settings.headers == {"Authorization": "Bearer from-file"}
    assert str(settings.url) == URL
