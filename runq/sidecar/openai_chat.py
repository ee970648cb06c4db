"""``kind = "openai-chat"``: execute a run as one call to an OpenAI-compatible
``POST {base_url}/chat/completions``.

```toml
[components."agent/summarize"]
kind = "openai-chat"
base_url = "https://api.openai.com/v1"     # literal, or "env:OPENAI_BASE_URL"
model = "gpt-4o-mini"
api_key = "env:OPENAI_API_KEY"             # or "file:/run/secrets/openai"; "" = send none
json_mode = false                          # true: response_format json_object, answer decoded
max_tokens = 1024                          # per run unless the payload asks for fewer/more
max_tokens_param = "max_tokens"            # or "max_completion_tokens" (models that want it)
stream = false                             # true: stream; each delta becomes a `delta` event
max_tokens_cap = 4096                      # the most a payload may ask for (default: max_tokens)
timeout_seconds = 120
temperature = 0.2                          # optional
system = "You summarise support tickets."  # optional, prepended unless the run sends one
prices = { prompt_per_1m = 0.15, completion_per_1m = 0.60 }   # or *_per_1k / *_per_token
```

The payload is ``{"messages": [...]}`` or ``{"prompt": "..."}`` (a bare string is a
prompt), optionally with ``"max_tokens"``. The answer is the assistant message's content.
With ``stream = true`` the completion is requested as a stream and every piece of text
that arrives is emitted as a ``delta`` event (``{"text": "..."}``), so a client following
the run sees the answer being written; the answer is the pieces joined.
Usage (tokens, and a cost from ``prices``) is recorded as soon as the response is read, so
the budget gate sees it before the next claim.

Failures: connection errors, timeouts, 408, 425, 429 and 5xx are retryable
(``retry-after-ms`` / ``Retry-After`` honoured); so is a malformed response body, or
content that is not JSON in JSON mode, because a provider glitch is not the run's fault.
401/403, other 4xx, a refusal and a bad payload are permanent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from runq.errors import ConfigError, Permanent, Retryable
from runq.sidecar.http_calls import (
    DEFAULT_MAX_RESPONSE_BYTES,
    ClientSettings,
    Handler,
    Outcome,
    PooledClient,
    SidecarContext,
    SpecReader,
    before_long_call,
    classify_status,
    display_url,
    exchange,
    read_headers,
    read_limited,
    read_snippet,
    read_url,
    require_reference,
    status_failure,
)

DEFAULT_MAX_TOKENS = 1024
PAYLOAD_KEYS = ("messages", "prompt", "max_tokens")
#: Price units a ``prices`` table may use, as tokens per unit.
_PRICE_UNITS = {"per_token": 1, "per_1k": 1_000, "per_1m": 1_000_000}
_RESERVED_HEADERS = frozenset({"host", "content-type", "content-length", "authorization"})


@dataclass(frozen=True)
class Prices:
    """Cost per single token; 0 when no price is configured."""

    prompt: float = 0.0
    completion: float = 0.0

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return prompt_tokens * self.prompt + completion_tokens * self.completion


@dataclass(frozen=True)
class ChatSettings:
    name: str
    endpoint: httpx.URL
    model: str
    api_key: str | None
    json_mode: bool
    max_tokens: int
    max_tokens_cap: int
    timeout_seconds: float
    temperature: float | None
    system: str | None
    prices: Prices
    headers: Mapping[str, str]
    max_response_bytes: int
    stream: bool = False
    max_tokens_param: str = "max_tokens"


#: How the token limit may be named in the request body.
MAX_TOKENS_PARAMS = ("max_tokens", "max_completion_tokens")
#: The prefix of a data line of a streamed completion, and its last line.
_SSE_DATA = "data:"
_SSE_DONE = "[DONE]"


def read_settings(name: str, spec: Mapping[str, Any]) -> ChatSettings:
    """Validate the table at start; every error names its key. The key is read now, so a
    missing one stops the daemon instead of failing every run."""
    reader = SpecReader(name, spec)
    reader.string("kind")
    base_url = read_url(reader, "base_url")
    max_tokens = reader.integer("max_tokens", DEFAULT_MAX_TOKENS)
    settings = ChatSettings(
        name=name,
        endpoint=base_url.copy_with(path=base_url.path.rstrip("/") + "/chat/completions"),
        model=reader.string("model"),
        api_key=_read_api_key(reader),
        json_mode=reader.boolean("json_mode", False),
        max_tokens=max_tokens,
        max_tokens_cap=reader.integer("max_tokens_cap", max_tokens),
        timeout_seconds=reader.number("timeout_seconds", 120.0),
        temperature=reader.optional_number("temperature", minimum=0.0, maximum=2.0),
        system=reader.optional_string("system"),
        prices=_read_prices(reader.table("prices")),
        headers=read_headers(reader, lambda lower: lower in _RESERVED_HEADERS),
        max_response_bytes=reader.integer("max_response_bytes", DEFAULT_MAX_RESPONSE_BYTES),
        stream=reader.boolean("stream", False),
        max_tokens_param=reader.string("max_tokens_param", "max_tokens"),
    )
    if settings.max_tokens_param not in MAX_TOKENS_PARAMS:
        raise ConfigError(
            reader.key("max_tokens_param"), f"must be one of {', '.join(MAX_TOKENS_PARAMS)}"
        )
    if settings.stream and settings.json_mode:
        raise ConfigError(reader.key("stream"), "cannot be combined with json_mode")
    if settings.max_tokens_cap < settings.max_tokens:
        raise ConfigError(
            reader.key("max_tokens_cap"), f"must be >= max_tokens ({settings.max_tokens})"
        )
    reader.reject_unknown()
    return settings


def _read_api_key(reader: SpecReader) -> str | None:
    reference = reader.string("api_key", "env:OPENAI_API_KEY", allow_empty=True)
    if not reference:
        return None  # a local model server that wants no key
    return require_reference(reference, reader.key("api_key"))


def _read_prices(reader: SpecReader) -> Prices:
    per_token: dict[str, float] = {}
    for side in ("prompt", "completion"):
        given: dict[str, float] = {}
        for unit, tokens in _PRICE_UNITS.items():
            price = reader.optional_number(f"{side}_{unit}", minimum=0.0)
            if price is not None:
                given[f"{side}_{unit}"] = price / tokens
        if len(given) > 1:
            first, second = list(given)[:2]
            raise ConfigError(
                reader.key(second), f"give one price for {side} tokens, not {first} and {second}"
            )
        per_token[side] = next(iter(given.values()), 0.0)
    reader.reject_unknown()
    return Prices(prompt=per_token["prompt"], completion=per_token["completion"])


def build_openai_chat_component(name: str, spec: Mapping[str, Any]) -> Handler:
    """The factory ``ComponentRegistry`` calls for ``kind = "openai-chat"``; raises ConfigError."""
    return OpenAIChatComponent(read_settings(name, spec)).handle


#: The name ``runq.components.ComponentRegistry`` looks up in this module.
build_handler = build_openai_chat_component


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class OpenAIChatComponent:
    def __init__(self, settings: ChatSettings) -> None:
        self.settings = settings
        self.pool = PooledClient(ClientSettings(settings.timeout_seconds))
        self.what = f"{settings.name} (POST {display_url(settings.endpoint)})"

    async def handle(self, ctx: SidecarContext, payload: Any) -> Any:
        body = self.request_body(payload)
        before_long_call(ctx)
        reply = await (self._post_streamed(body, ctx) if self.settings.stream else self._post(body))
        usage = read_usage(reply)
        if usage is not None:
            # Before anything can fail below: the tokens are spent whatever the answer.
            cost = self.settings.prices.cost(usage.prompt_tokens, usage.completion_tokens)
            await ctx.record_usage(tokens=usage.total_tokens, cost=cost)
        return self._answer(reply)

    async def aclose(self) -> None:
        await self.pool.aclose()

    # -- request ----------------------------------------------------------------------

    def request_body(self, payload: Any) -> dict[str, Any]:
        if isinstance(payload, str):
            payload = {"prompt": payload}
        if not isinstance(payload, dict):
            raise Permanent(
                f"{self.settings.name}: the payload must be {{'messages': [...]}} or "
                f"{{'prompt': '...'}}, not {type(payload).__name__}"
            )
        unknown = sorted(set(payload) - set(PAYLOAD_KEYS))
        if unknown:
            raise Permanent(
                f"{self.settings.name}: unknown payload key(s) {', '.join(unknown)}; "
                f"known: {', '.join(PAYLOAD_KEYS)}"
            )
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": self._messages(payload),
            self.settings.max_tokens_param: self._max_tokens(payload.get("max_tokens")),
        }
        if self.settings.stream:
            # The last chunk then carries the usage, so the tokens are recorded as usual.
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if self.settings.temperature is not None:
            body["temperature"] = self.settings.temperature
        if self.settings.json_mode:
            body["response_format"] = {"type": "json_object"}
        return body

    def _messages(self, payload: Mapping[str, Any]) -> list[Any]:
        messages, prompt = payload.get("messages"), payload.get("prompt")
        if (messages is None) == (prompt is None):
            raise Permanent(f"{self.settings.name}: the payload needs 'messages' or 'prompt'")
        if prompt is not None:
            if not isinstance(prompt, str) or not prompt.strip():
                raise Permanent(f"{self.settings.name}: 'prompt' must be a non-empty string")
            messages = [{"role": "user", "content": prompt}]
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
        ):
            raise Permanent(
                f"{self.settings.name}: 'messages' must be a non-empty list of "
                "{'role': ..., 'content': ...} objects"
            )
        if self.settings.system and messages[0].get("role") != "system":
            messages = [{"role": "system", "content": self.settings.system}, *messages]
        return messages

    def _max_tokens(self, asked: Any) -> int:
        if asked is None:
            return self.settings.max_tokens
        cap = self.settings.max_tokens_cap
        if isinstance(asked, bool) or not isinstance(asked, int) or not 1 <= asked <= cap:
            raise Permanent(
                f"{self.settings.name}: payload max_tokens {asked!r} must be an integer "
                f"from 1 to {cap} (max_tokens_cap)"
            )
        return asked

    def _headers(self) -> dict[str, str]:
        headers = {**self.settings.headers, "Content-Type": "application/json"}
        if self.settings.api_key is not None:
            headers["Authorization"] = f"Bearer {self.settings.api_key}"
        return headers

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """One call: the decoded reply, or a classified failure."""
        client = self.pool.get()
        request = client.build_request(
            "POST",
            self.settings.endpoint,
            headers=self._headers(),
            content=msgspec.json.encode(body),
        )
        return await exchange(
            client,
            request,
            timeout_seconds=self.settings.timeout_seconds,
            what=self.what,
            read=self._read,
        )

    async def _read(self, response: httpx.Response) -> dict[str, Any]:
        if classify_status(response.status_code) is not Outcome.SUCCESS:
            hint = "check api_key" if response.status_code in (401, 403) else ""
            snippet = provider_error(await read_snippet(response))
            raise status_failure(self.what, response, snippet, hint=hint)
        content = await read_limited(response, self.settings.max_response_bytes)
        try:
            reply = msgspec.json.decode(content)
        except msgspec.DecodeError as e:
            raise Retryable(f"{self.what} answered a body that is not JSON: {e}") from e
        if not isinstance(reply, dict):
            raise Retryable(f"{self.what} answered JSON that is not an object")
        return reply

    async def _post_streamed(self, body: dict[str, Any], ctx: SidecarContext) -> dict[str, Any]:
        """One streamed call, each text delta emitted as it arrives; the reply rebuilt as
        the non-streamed shape (joined content, usage) for the rest of the handler."""
        client = self.pool.get()
        request = client.build_request(
            "POST",
            self.settings.endpoint,
            headers={**self._headers(), "Accept": "text/event-stream"},
            content=msgspec.json.encode(body),
        )

        async def read(response: httpx.Response) -> dict[str, Any]:
            if classify_status(response.status_code) is not Outcome.SUCCESS:
                return await self._read(response)  # raises the classified failure
            return await self._read_stream(response, ctx)

        return await exchange(
            client,
            request,
            timeout_seconds=self.settings.timeout_seconds,
            what=self.what,
            read=read,
        )

    async def _read_stream(self, response: httpx.Response, ctx: SidecarContext) -> dict[str, Any]:
        pieces: list[str] = []
        usage: Any = None
        received = 0
        async for line in response.aiter_lines():
            received += len(line) + 1
            if received > self.settings.max_response_bytes:
                raise Retryable(
                    f"{self.what} streamed more than {self.settings.max_response_bytes} bytes"
                )
            if not line.startswith(_SSE_DATA):
                continue  # blank separators, comments, event names
            data = line[len(_SSE_DATA) :].strip()
            if data == _SSE_DONE:
                break
            chunk = _decode_chunk(data, self.what)
            usage = chunk.get("usage") or usage
            piece = _delta_text(chunk)
            if piece:
                pieces.append(piece)
                await ctx.emit("delta", {"text": piece})
        else:
            raise Retryable(f"{self.what} ended the stream before [DONE]")
        reply: dict[str, Any] = {"choices": [{"message": {"content": "".join(pieces)}}]}
        if usage is not None:
            reply["usage"] = usage
        return reply

    # -- answer -----------------------------------------------------------------------

    def _answer(self, reply: Mapping[str, Any]) -> Any:
        message = assistant_message(reply)
        if message is None:
            raise Retryable(f"{self.what} answered without choices[0].message")
        content = message.get("content")
        if not isinstance(content, str):
            refusal = message.get("refusal")
            if isinstance(refusal, str) and refusal:
                # The model declined; the same request would be declined again.
                raise Permanent(f"{self.settings.name}: the model refused: {refusal[:200]}")
            raise Retryable(f"{self.what} answered a message without text content")
        if not self.settings.json_mode:
            return content
        try:
            return msgspec.json.decode(content)
        except msgspec.DecodeError as e:
            raise Retryable(f"{self.what} answered content that is not JSON in JSON mode") from e


def _decode_chunk(data: str, what: str) -> dict[str, Any]:
    try:
        chunk = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise Retryable(f"{what} streamed a chunk that is not JSON: {e}") from e
    if not isinstance(chunk, dict):
        raise Retryable(f"{what} streamed JSON that is not an object")
    return chunk


def _delta_text(chunk: Mapping[str, Any]) -> str:
    """``choices[0].delta.content`` of a streamed chunk, "" when it carries none."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    delta = choices[0].get("delta")
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""


def assistant_message(reply: Mapping[str, Any]) -> dict[str, Any] | None:
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


def read_usage(reply: Mapping[str, Any]) -> Usage | None:
    """``usage`` of a chat completion; None when the provider sent none (some local servers)."""
    usage = reply.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    total = _count(usage.get("total_tokens")) or prompt + completion
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def provider_error(snippet: str) -> str:
    """The provider's ``error.message`` when the snippet is its JSON error object."""
    try:
        decoded = msgspec.json.decode(snippet)
    except msgspec.DecodeError:
        return snippet
    error = decoded.get("error") if isinstance(decoded, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        code = error.get("code") or error.get("type")
        return f"{error['message']} ({code})" if code else str(error["message"])
    return snippet
