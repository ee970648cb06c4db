"""The app in-process (Litestar's test client) around a real Queue on SQLite: the error
paths a live daemon cannot be made to take on demand (a store that goes away, a bug, a
seal failure, a readiness check that raises)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from api_support import assert_error, submission
from litestar.testing import AsyncTestClient

from runq.api import ApiServices
from runq.api.app import create_app
from runq.config import Config, HttpConfig, StoreConfig
from runq.errors import ConfigError, SealError, StoreUnavailable
from runq.ops.operations import Operations
from runq.queue import Queue

pytestmark = pytest.mark.anyio

MARKER = "SECRET-PAYLOAD-c0ffee"


class Probe:
    """Readiness the test can steer."""

    def __init__(self) -> None:
        self.answer: tuple[bool, str] | Exception = (True, "ok")
        self.woken = 0

    async def readiness(self) -> tuple[bool, str]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def metrics(self) -> bytes:
        return b"runq_up 1\n"

    def wake(self) -> None:
        self.woken += 1


def services(queue: Queue, probe: Probe, *, worker: bool = True) -> ApiServices:
    return ApiServices(
        queue=queue,
        ops=Operations(queue.store, queue.config),
        config=queue.config,
        worker_enabled=worker,
        render_metrics=probe.metrics,
        readiness=probe.readiness,
        wake=probe.wake,
    )


@pytest.fixture
async def queue(tmp_path: Path) -> AsyncIterator[Queue]:
    config = Config(store=StoreConfig(url=f"sqlite:///{tmp_path / 'runq.db'}"))
    async with Queue.open(config=config) as q:
        yield q


@pytest.fixture
async def client_and_probe(queue: Queue) -> AsyncIterator[tuple[AsyncTestClient[Any], Probe]]:
    probe = Probe()
    # localhost: the edge checks refuse the test client's default "testserver.local".
    app = create_app(services(queue, probe))
    async with AsyncTestClient(app=app, base_url="http://localhost") as client:
        yield client, probe


async def test_readyz_answers_503_when_not_ready_or_when_the_check_raises(
    client_and_probe: tuple[AsyncTestClient[Any], Probe],
) -> None:
    client, probe = client_and_probe
    ready = {"status": "ready", "detail": "ok", "database": "sqlite"}
    assert (await client.get("/readyz")).json() == ready
    probe.answer = (False, "draining")
    assert assert_error(await client.get("/readyz"), 503, "not_ready")["detail"] == "draining"
    probe.answer = RuntimeError("boom")
    assert "RuntimeError" in assert_error(await client.get("/readyz"), 503)["detail"]
    assert (await client.get("/healthz")).status_code == 200


async def test_store_unavailable_is_503_with_retry_after(
    client_and_probe: tuple[AsyncTestClient[Any], Probe],
    queue: Queue,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, _ = client_and_probe

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("database at sqlite:///x is unreachable")

    monkeypatch.setattr(queue.store, "submit", down)
    monkeypatch.setattr(queue.store, "get", down)
    for response in (
        await client.post("/runs", json=submission()),
        await client.get("/runs/some-id"),
    ):
        assert_error(response, 503, "store_unavailable")
        assert response.headers["retry-after"] == "5"


async def test_a_bug_is_500_and_its_message_stays_out_of_the_log(
    client_and_probe: tuple[AsyncTestClient[Any], Probe],
    queue: Queue,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, _ = client_and_probe

    async def buggy(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"could not handle {MARKER}")

    monkeypatch.setattr(queue, "submit", buggy)
    with caplog.at_level(logging.DEBUG):
        response = await client.post("/runs", json=submission(payload={"p": MARKER}))
    assert_error(response, 500, "internal")
    assert MARKER not in response.text
    assert "RuntimeError" in caplog.text
    assert MARKER not in caplog.text


async def test_a_seal_failure_is_500_naming_the_run_not_the_value(
    client_and_probe: tuple[AsyncTestClient[Any], Probe],
    queue: Queue,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, _ = client_and_probe

    async def sealed(*args: Any, **kwargs: Any) -> Any:
        raise SealError("run r1: payload failed to open")

    monkeypatch.setattr(queue.store, "get", sealed)
    body = assert_error(await client.get("/runs/r1"), 500, "seal_error")
    assert "r1" in body["detail"]


async def test_requeue_wakes_the_local_claimers(
    client_and_probe: tuple[AsyncTestClient[Any], Probe],
) -> None:
    client, probe = client_and_probe
    accepted = (await client.post("/runs", json=submission(delay_seconds=3600))).json()
    await client.post(f"/runs/{accepted['run_id']}/cancel")
    response = await client.post(f"/queue/jobs/{accepted['run_id']}/requeue")
    assert response.status_code == 200, response.text
    assert probe.woken == 1


async def test_metrics_pass_through_with_the_prometheus_content_type(
    client_and_probe: tuple[AsyncTestClient[Any], Probe],
) -> None:
    client, _ = client_and_probe
    response = await client.get("/metrics")
    assert response.text == "runq_up 1\n"
    assert response.headers["content-type"].startswith("text/plain; version=")


async def test_create_app_refuses_an_unreadable_key(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RUNQ_TEST_NO_SUCH_KEY", raising=False)
    config = Config(
        store=queue.config.store, http=HttpConfig(auth="key", key="env:RUNQ_TEST_NO_SUCH_KEY")
    )
    broken = ApiServices(
        queue=queue,
        ops=Operations(queue.store, queue.config),
        config=config,
        worker_enabled=True,
        render_metrics=Probe().metrics,
        readiness=Probe().readiness,
        wake=lambda: None,
    )
    with pytest.raises(ConfigError, match="RUNQ_TEST_NO_SUCH_KEY"):
        create_app(broken)


async def test_openapi_documents_every_error_as_error_body(
    client_and_probe: tuple[AsyncTestClient[Any], Probe],
) -> None:
    client, _ = client_and_probe
    document = (await client.get("/schema/openapi.json")).json()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if int(status) < 400:
                    continue
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)
