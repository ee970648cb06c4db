"""``kind = "openai-chat"`` against a fake OpenAI-compatible server on 127.0.0.1: the
request, the answer, usage and cost, JSON mode, and which failures are retried and which are not."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from runq.errors import ConfigError, Permanent, Retryable
from runq.sidecar.openai_chat import build_openai_chat_component, read_settings
from sidecar.sidecar_fakes import FakeHooks, make_ctx
from sidecar.sidecar_servers import Reply, ScriptedServer, free_port

pytestmark = pytest.mark.anyio

NAME = "agent/summarize"
PATH = "/v1/chat/completions"


def completion(
    content: Any = "a summary",
    *,
    usage: dict[str, int] | None = None,
    message: dict[str, Any] | None = None,
) -> dict[str, Any]:
    reply: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "message": message or {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
    }
    if usage is not None:
        reply["usage"] = usage
    return reply


USAGE = {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("RUNQ_TEST_OPENAI_KEY", "sk-test-123")
    return "sk-test-123"


def chat(server: ScriptedServer, **spec: Any) -> Any:
    base = {
        "kind": "openai-chat",
        "base_url": server.url + "/v1",
        "model": "test-model",
        "api_key": "env:RUNQ_TEST_OPENAI_KEY",
    }
    return build_openai_chat_component(NAME, {**base, **spec})


async def call(handler: Any, payload: Any) -> tuple[Any, FakeHooks]:
    ctx, hooks = make_ctx(component=NAME)
    return await handler(ctx, payload), hooks


# -- success ---------------------------------------------------------------------------------


async def test_messages_answer_and_usage_with_cost(app_server: ScriptedServer) -> None:
    app_server.route(PATH, Reply.json(completion("a summary", usage=USAGE)))
    handler = chat(
        app_server,
        temperature=0.2,
        prices={"prompt_per_1k": 0.5, "completion_per_1k": 1.5},
    )
    messages = [{"role": "user", "content": "Summarise: ..."}]

    answer, hooks = await call(handler, {"messages": messages})

    assert answer == "a summary"
    [(tokens, cost)] = hooks.usage
    assert tokens == 1500
    assert cost == pytest.approx(1000 * 0.5 / 1000 + 500 * 1.5 / 1000)
    [request] = app_server.on(PATH)
    assert request.method == "POST"
    assert request.headers["authorization"] == "Bearer sk-test-123"
    assert request.json() == {
        "model": "test-model",
        "messages": messages,
        "max_tokens": 1024,
        "temperature": 0.2,
    }


async def test_prompt_system_and_per_run_max_tokens(app_server: ScriptedServer) -> None:
    app_server.route(PATH, Reply.json(completion("ok", usage=USAGE)))
    handler = chat(
        app_server, system="Be brief.", max_tokens=100, max_tokens_cap=400,
        prices={"prompt_per_1m": 2.0, "completion_per_token": 0.001},
    )  # fmt: skip

    answer, hooks = await call(handler, {"prompt": "Hello", "max_tokens": 300})

    assert answer == "ok"
    [(tokens, cost)] = hooks.usage
    assert tokens == 1500
    assert cost == pytest.approx(1000 * 2.0 / 1e6 + 500 * 0.001)
    body = app_server.requests[0].json()
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
    ]
    assert body["max_tokens"] == 300
    assert "temperature" not in body


async def test_a_bare_string_payload_is_a_prompt(app_server: ScriptedServer) -> None:
    app_server.route(PATH, Reply.json(completion("hi")))
    answer, hooks = await call(chat(app_server), "Say hi")
    assert answer == "hi"
    assert hooks.usage == []  # the provider sent no usage: nothing to record
    assert app_server.requests[0].json()["messages"] == [{"role": "user", "content": "Say hi"}]


async def test_a_run_system_message_is_kept(app_server: ScriptedServer) -> None:
    app_server.route(PATH, Reply.json(completion("x")))
    messages = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "q"}]
    await call(chat(app_server, system="Configured."), {"messages": messages})
    assert app_server.requests[0].json()["messages"] == messages


async def test_total_tokens_missing_is_the_sum(app_server: ScriptedServer) -> None:
    usage = {"prompt_tokens": 7, "completion_tokens": 3}
    app_server.route(PATH, Reply.json(completion("x", usage=usage)))
    _, hooks = await call(chat(app_server), "q")
    assert hooks.usage == [(10, 0.0)]


async def test_no_api_key_sends_no_authorization(app_server: ScriptedServer) -> None:
    app_server.route(PATH, Reply.json(completion("local")))
    answer, _ = await call(chat(app_server, api_key=""), "q")
    assert answer == "local"
    assert "authorization" not in app_server.requests[0].headers


# -- JSON mode -------------------------------------------------------------------------------


async def test_json_mode_decodes_the_content(app_server: ScriptedServer) -> None:
    app_server.route(PATH, Reply.json(completion('{"title": "T", "tags": ["a"]}', usage=USAGE)))
    answer, hooks = await call(chat(app_server, json_mode=True), "as JSON please")
    assert answer == {"title": "T", "tags": ["a"]}
    assert app_server.requests[0].json()["response_format"] == {"type": "json_object"}
    assert hooks.usage[0][0] == 1500


async def test_json_mode_content_that_is_not_json_is_retryable_and_still_billed(
    app_server: ScriptedServer,
) -> None:
    app_server.route(PATH, Reply.json(completion("Sure! Here is", usage=USAGE)))
    ctx, hooks = make_ctx(component=NAME)
    with pytest.raises(Retryable, match="not JSON in JSON mode"):
        await chat(app_server, json_mode=True)(ctx, "q")
    assert hooks.usage == [(1500, 0.0)]  # the tokens were spent whatever the answer


# -- provider failures -----------------------------------------------------------------------


def provider_error(status: int, message: str, code: str, **kw: Any) -> Reply:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return Reply.json(body, status=status, **kw)


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_failures_are_permanent(app_server: ScriptedServer, status: int) -> None:
    app_server.route(PATH, provider_error(status, "Incorrect API key provided", "invalid_api_key"))
    with pytest.raises(Permanent) as info:
        await call(chat(app_server), "q")
    assert "check api_key" in str(info.value)
    assert "Incorrect API key provided (invalid_api_key)" in str(info.value)
    assert "sk-test-123" not in str(info.value)


@pytest.mark.parametrize("status", [400, 404, 422])
async def test_other_client_errors_are_permanent(app_server: ScriptedServer, status: int) -> None:
    app_server.route(PATH, provider_error(status, "The model does not exist", "model_not_found"))
    with pytest.raises(Permanent, match="The model does not exist"):
        await call(chat(app_server), "q")


async def test_rate_limit_is_retryable_with_retry_after_ms(app_server: ScriptedServer) -> None:
    reply = provider_error(
        429,
        "Rate limit reached",
        "rate_limit_exceeded",
        headers=[("retry-after-ms", "2500"), ("retry-after", "3")],
    )
    app_server.route(PATH, reply)
    with pytest.raises(Retryable) as info:
        await call(chat(app_server), "q")
    assert info.value.retry_after == 2.5
    assert "Rate limit reached" in str(info.value)


@pytest.mark.parametrize("status", [500, 502, 503, 529])
async def test_server_errors_are_retryable(app_server: ScriptedServer, status: int) -> None:
    app_server.route(PATH, Reply.text("upstream overloaded", status=status))
    with pytest.raises(Retryable, match="upstream overloaded"):
        await call(chat(app_server), "q")


async def test_connection_refused_is_retryable() -> None:
    handler = build_openai_chat_component(
        NAME,
        {
            "kind": "openai-chat",
            "base_url": f"http://127.0.0.1:{free_port()}/v1",
            "model": "m",
            "api_key": "env:RUNQ_TEST_OPENAI_KEY",
        },
    )
    with pytest.raises(Retryable):
        await call(handler, "q")


async def test_timeout_is_retryable(app_server: ScriptedServer) -> None:
    app_server.route(PATH, Reply.json(completion("late"), delay=10))
    ctx, hooks = make_ctx(component=NAME)
    started = time.monotonic()
    with pytest.raises(Retryable, match="timed out"):
        await chat(app_server, timeout_seconds=2.5)(ctx, "q")
    assert time.monotonic() - started < 6
    assert hooks.renewals_asked == 1


@pytest.mark.parametrize(
    "reply",
    [
        Reply(body=b"<html>502 Bad Gateway</html>", headers=[("content-type", "text/html")]),
        Reply(body=b'{"choices": [', headers=[("content-type", "application/json")]),
        Reply.json(["not", "an", "object"]),
        Reply.json({"object": "chat.completion"}),
        Reply.json({"choices": []}),
        Reply.json(completion(message={"role": "assistant", "content": None})),
    ],
    ids=["html", "truncated", "array", "no-choices", "empty-choices", "no-content"],
)
async def test_malformed_provider_responses_are_retryable(
    app_server: ScriptedServer, reply: Reply
) -> None:
    app_server.route(PATH, reply)
    with pytest.raises(Retryable):
        await call(chat(app_server), "q")


async def test_a_refusal_is_permanent(app_server: ScriptedServer) -> None:
    message = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    app_server.route(PATH, Reply.json(completion(message=message, usage=USAGE)))
    ctx, hooks = make_ctx(component=NAME)
    with pytest.raises(Permanent, match="refused"):
        await chat(app_server)(ctx, "q")
    assert hooks.usage == [(1500, 0.0)]


async def test_oversized_response_is_refused(app_server: ScriptedServer) -> None:
    app_server.route(PATH, Reply.json(completion("z" * 5000)))
    with pytest.raises(Permanent, match="larger than 1024 bytes"):
        await call(chat(app_server, max_response_bytes=1024), "q")


# -- bad payloads (permanent, nothing sent) --------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (None, "NoneType"),
        (42, "int"),
        ({}, "'messages' or 'prompt'"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "'messages' or"),
        ({"prompt": ""}, "non-empty"),
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"content": "no role"}]}, "non-empty list"),
        ({"prompt": "a", "max_tokens": 5000}, "max_tokens_cap"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens_cap"),
        ({"prompt": "a", "temperature": 2}, "unknown payload key"),
    ],
)
async def test_bad_payloads_are_permanent(
    app_server: ScriptedServer, payload: Any, reason: str
) -> None:
    with pytest.raises(Permanent) as info:
        await call(chat(app_server), payload)
    assert reason in str(info.value)
    assert app_server.requests == []


# -- configuration ---------------------------------------------------------------------------


BASE = {"kind": "openai-chat", "base_url": "http://127.0.0.1:9/v1", "model": "m"}


@pytest.mark.parametrize(
    ("spec", "key", "reason"),
    [
        ({"base_url": None}, "base_url", "required"),
        ({"model": None}, "model", "required"),
        ({"api_key": "sk-inline"}, "api_key", "never an inline secret"),
        ({"api_key": "env:RUNQ_TEST_SURELY_UNSET"}, "api_key", "is not set"),
        ({"max_tokens": 0}, "max_tokens", ">= 1"),
        ({"max_tokens": 500, "max_tokens_cap": 100}, "max_tokens_cap", ">= max_tokens"),
        ({"temperature": 3}, "temperature", "<= 2"),
        ({"json_mode": 1}, "json_mode", "true or false"),
        (
            {"prices": {"prompt_per_1k": 1, "prompt_per_token": 0.001}},
            "prices.prompt_per_1k",
            "not prompt_per_token and prompt_per_1k",
        ),
        ({"prices": {"prompt_per_1k": -1}}, "prices.prompt_per_1k", ">= 0"),
        ({"prices": {"input_per_1k": 1}}, "prices.input_per_1k", "unknown key"),
        ({"modle": "x"}, "modle", "unknown key"),
        ({"headers": {"Authorization": "env:RUNQ_TEST_OPENAI_KEY"}}, "Authorization", "runq"),
    ],
)
def test_bad_config_names_the_key(spec: dict[str, Any], key: str, reason: str) -> None:
    merged = {"api_key": "env:RUNQ_TEST_OPENAI_KEY", **BASE, **spec}
    merged = {k: v for k, v in merged.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        build_openai_chat_component(NAME, merged)
    assert info.value.key.startswith('components."agent/summarize".')
    assert info.value.key.endswith(key)
    assert reason in str(info.value)


def test_key_and_base_url_from_files(tmp_path: Path, app_server: ScriptedServer) -> None:
    (tmp_path / "key").write_text("sk-from-file\n")
    (tmp_path / "url").write_text(app_server.url + "/v1/\n")
    settings = read_settings(
        NAME,
        {**BASE, "base_url": f"file:{tmp_path / 'url'}", "api_key": f"file:{tmp_path / 'key'}"},
    )
    assert settings.api_key == "sk-from-file"
    assert str(settings.endpoint) == app_server.url + "/v1/chat/completions"
