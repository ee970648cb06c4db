"""The edge checks in-process, in every auth mode: Host, Origin and Content-Type are
refused before credentials are looked at, so key and JWT servers get them too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from api_support import JWT_SECRET, assert_error, bearer, mint, submission
from litestar.testing import AsyncTestClient

from runq.api import ApiServices
from runq.api.app import create_app
from runq.api.edge import is_json_media_type, same_origin, split_host
from runq.config import Config, HttpConfig, JwtConfig, StoreConfig
from runq.ops.operations import Operations
from runq.queue import Queue

pytestmark = pytest.mark.anyio

API_KEY = "edge-test-key-0123456789abcdef"
ORIGIN = "http://localhost:7777"


async def _nothing() -> bytes:
    return b""


async def _ready() -> tuple[bool, str]:
    return True, "ok"


def http_config(mode: str, **fields: Any) -> HttpConfig:
    jwt = JwtConfig(secret="env:RUNQ_TEST_EDGE_JWT", issuer="", audience="")
    return HttpConfig(auth=mode, key="env:RUNQ_TEST_EDGE_KEY", jwt=jwt, **fields)


@pytest.fixture
async def queue(tmp_path: Path) -> AsyncIterator[Queue]:
    config = Config(store=StoreConfig(url=f"sqlite:///{tmp_path / 'runq.db'}"))
    async with Queue.open(config=config) as q:
        yield q


def client_for(queue: Queue, http: HttpConfig) -> AsyncTestClient[Any]:
    services = ApiServices(
        queue=queue,
        ops=Operations(queue.store, queue.config),
        config=Config(store=queue.config.store, http=http),
        worker_enabled=True,
        render_metrics=_nothing,
        readiness=_ready,
        wake=lambda: None,
    )
    return AsyncTestClient(app=create_app(services), base_url="http://localhost:7777")


def credentials(mode: str) -> dict[str, str]:
    if mode == "key":
        return bearer(API_KEY)
    if mode == "jwt":
        return bearer(mint("alice", aud=None, iss=None))
    return {}


@pytest.mark.parametrize("mode", ["open", "key", "jwt"])
async def test_every_auth_mode_gets_the_edge_checks(
    mode: str, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNQ_TEST_EDGE_KEY", API_KEY)
    monkeypatch.setenv("RUNQ_TEST_EDGE_JWT", JWT_SECRET)
    async with client_for(queue, http_config(mode)) as client:
        good = credentials(mode)
        body = b'{"component_type": "task", "component_id": "echo"}'
        # Refused before authentication: with or without credentials, the same answer.
        for auth in ({}, good):
            text = await client.post(
                "/runs", content=body, headers={**auth, "content-type": "text/plain"}
            )
            assert_error(text, 415, "unsupported_media_type")
            foreign = {**auth, "Origin": "https://attacker.example"}
            assert_error(await client.post("/runs", json=submission(), headers=foreign), 403)
            rebound = {**auth, "Host": "attacker.example:7777"}
            assert_error(await client.get("/runs/x", headers=rebound), 421, "host_not_allowed")
        ok = await client.post("/runs", json=submission(), headers={**good, "Origin": ORIGIN})
        assert ok.status_code == 202, ok.text


async def test_allowed_hosts_star_turns_the_host_check_off(queue: Queue) -> None:
    async with client_for(queue, http_config("open", allowed_hosts=("*",))) as client:
        response = await client.get("/healthz", headers={"Host": "anything.example"})
        assert response.status_code == 200
        # The Origin check still holds: it compares with the Host the request names.
        cross = await client.post(
            "/runs", json=submission(), headers={"Origin": "http://attacker.example"}
        )
        assert_error(cross, 403, "origin_not_allowed")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("LocalHost:7777", ("localhost", 7777)),
        ("[::1]:7777", ("::1", 7777)),
        ("[::1]", ("::1", None)),
        ("runq.example.com.", ("runq.example.com", None)),
        ("10.0.0.5:99999999", ("10.0.0.5", None)),
        ("host:port", ("host:port", None)),
    ],
)
def test_split_host(value: str, expected: tuple[str, int | None]) -> None:
    assert split_host(value) == expected


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://localhost:7777", "localhost:7777", True),
        ("https://runq.example.com", "runq.example.com", True),  # TLS proxy, Host without port
        ("http://runq.example.com", "runq.example.com:80", True),
        ("https://runq.example.com", "runq.example.com:80", False),
        ("http://localhost:7778", "localhost:7777", False),
        ("http://evil.example:7777", "localhost:7777", False),
        ("null", "localhost:7777", False),
        ("http://localhost:notaport", "localhost:7777", False),
        ("ftp://localhost:7777", "localhost:7777", False),
    ],
)
def test_same_origin(origin: str, host: str, same: bool) -> None:
    assert same_origin(origin, host) is same


@pytest.mark.parametrize(
    ("content_type", "ok"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/problem+json", True),
        ("text/plain", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
        ("text/json", False),
        ("", False),
    ],
)
def test_json_media_types(content_type: str, ok: bool) -> None:
    assert is_json_media_type(content_type) is ok
