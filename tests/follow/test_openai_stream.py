"""``kind = "openai-chat"`` with ``stream = true`` against the scripted OpenAI-compatible
server of the sidecar tests: each delta becomes a ``delta`` event, the answer is the joined
text, usage comes from the last chunk; ``max_tokens_param`` names the limit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from sidecar.sidecar_fakes import FakeHooks, make_ctx
from sidecar.sidecar_servers import Reply, ScriptedServer, serve_scripted

from runq.errors import ConfigError, Retryable
from runq.sidecar.openai_chat import build_openai_chat_component

pytestmark = pytest.mark.anyio
NAME = "agent/chat"
PATH = "/v1/chat/completions"


class EmittingHooks(FakeHooks):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, Any]] = []

    async def emit(self, kind: str, data: Any) -> None:
        self.events.append((kind, data))


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    monkeypatch.setenv("RUNQ_TEST_OPENAI_KEY", "sk-test-123")
    with serve_scripted() as scripted:
        yield scripted


def _chat(server: ScriptedServer, **spec: Any) -> Any:
    base = {
        "kind": "openai-chat",
        "base_url": server.url + "/v1",
        "model": "test-model",
        "api_key": "env:RUNQ_TEST_OPENAI_KEY",
        "stream": True,
    }
    return build_openai_chat_component(NAME, {**base, **spec})


def _chunk(text: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    chunk: dict[str, Any] = {"object": "chat.completion.chunk", "choices": []}
    if text is not None:
        chunk["choices"] = [{"index": 0, "delta": {"content": text}}]
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + msgspec.json.encode(chunk) + b"\n\n"


def _stream(*chunks: bytes, done: bool = True) -> Reply:
    tail = [b"data: [DONE]\n\n"] if done else []
    return Reply(
        headers=[("content-type", "text/event-stream")],
        body=b": opening\n\n",
        chunks=[*chunks, *tail],
        chunk_delay=0.01,
    )


async def _call(handler: Any, payload: Any) -> tuple[Any, EmittingHooks]:
    hooks = EmittingHooks()
    ctx, _ = make_ctx(hooks, component=NAME)
    return await handler(ctx, payload), hooks


async def test_each_delta_is_an_event_and_the_answer_is_the_joined_text(
    server: ScriptedServer,
) -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    server.route(
        PATH,
        _stream(_chunk("Hel"), _chunk("lo"), _chunk(""), _chunk("!"), _chunk(usage=usage)),
    )
    handler = _chat(server, max_tokens_param="max_completion_tokens")

    answer, hooks = await _call(handler, {"prompt": "Say hello"})

    assert answer == "Hello!"
    assert hooks.events == [
        ("delta", {"text": "Hel"}),
        ("delta", {"text": "lo"}),
        ("delta", {"text": "!"}),
    ]
    assert hooks.usage == [(13, 0.0)]
    [request] = server.on(PATH)
    body = request.json()
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_completion_tokens"] == 1024
    assert "max_tokens" not in body


async def test_a_stream_cut_before_done_is_retried(server: ScriptedServer) -> None:
    server.route(PATH, _stream(_chunk("partial"), done=False))
    with pytest.raises(Retryable):
        await _call(_chat(server), {"prompt": "hi"})


async def test_a_refused_streamed_request_is_classified_as_without_streaming(
    server: ScriptedServer,
) -> None:
    server.route(PATH, Reply.json({"error": {"message": "slow down"}}, status=429))
    with pytest.raises(Retryable):
        await _call(_chat(server), {"prompt": "hi"})


async def test_bad_settings_are_refused_at_start(server: ScriptedServer) -> None:
    with pytest.raises(ConfigError):
        _chat(server, max_tokens_param="tokens")
    with pytest.raises(ConfigError):
        _chat(server, json_mode=True)
