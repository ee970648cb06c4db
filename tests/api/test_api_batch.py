"""``POST /runs/batch`` and per-run ``timeout_seconds`` against real ``runq serve`` processes
on both engines: all or nothing, the index of the first bad item, order and created flags,
the bounds of ``POST /runs``, and the executor honouring a run's own deadline."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import api_config, assert_error, server_env, submission, wait_status
from serve_harness import (  # fixtures are used by name
    RunqServer,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]

FAR_FUTURE = 3600.0


async def start(serve_factory: ServeFactory, **sections: Any) -> RunqServer:
    return await serve_factory(api_config(**sections), env=server_env())


async def job_count(server: RunqServer) -> int:
    response = await server.request("GET", "/queue/jobs", params={"limit": 1})
    assert response.status_code == 200, response.text
    count: int = response.json()["meta"]["total_count"]
    return count


def items(n: int, **fields: Any) -> list[dict[str, Any]]:
    return [submission("task/echo", {"i": i}, delay_seconds=FAR_FUTURE, **fields) for i in range(n)]


async def test_a_bad_item_at_517_refuses_the_whole_batch(serve_factory: ServeFactory) -> None:
    server = await start(serve_factory)
    batch = items(1000)
    batch[517]["component_type"] = "gadget"
    refused = await server.request("POST", "/runs/batch", json={"items": batch})
    detail = assert_error(refused, 400, "bad_request")["detail"]
    assert "items[517].component_type" in detail, detail
    assert await job_count(server) == 0

    batch[517] = submission("task/missing", {"i": 517})
    refused = await server.request("POST", "/runs/batch", json={"items": batch})
    assert assert_error(refused, 400, "unknown_component")["detail"].startswith("items[517]: ")
    assert await job_count(server) == 0

    batch[517] = submission("task/echo", {"i": 517}, timeout_seconds=86_401)
    refused = await server.request("POST", "/runs/batch", json={"items": batch})
    detail = assert_error(refused, 400, "bad_request")["detail"]
    assert detail.startswith("items[517]: timeout_seconds"), detail
    assert "max_timeout_seconds" in detail
    assert await job_count(server) == 0


async def test_accepted_in_order_with_created_flags(serve_factory: ServeFactory) -> None:
    server = await start(serve_factory)
    first = await server.request(
        "POST", "/runs", json=submission("task/echo", {"n": 0}), headers={"Idempotency-Key": "a"}
    )
    assert first.status_code == 202
    batch = items(5)
    batch[1]["idempotency_key"] = "a"
    batch[3]["idempotency_key"] = "b"
    batch[4]["idempotency_key"] = "b"
    response = await server.request("POST", "/runs/batch", json={"items": batch})
    assert response.status_code == 202, response.text
    answered = response.json()["items"]
    assert [a["created"] for a in answered] == [True, False, True, True, False]
    assert answered[1]["run_id"] == first.json()["run_id"]
    assert answered[4]["run_id"] == answered[3]["run_id"]
    assert len({a["run_id"] for a in answered}) == 4
    for i in (0, 2, 3):
        run = (await server.request("GET", f"/runs/{answered[i]['run_id']}")).json()
        assert run["payload"] == {"i": i}
    assert await job_count(server) == 4


async def test_batch_size_and_depth_limits(serve_factory: ServeFactory) -> None:
    server = await start(serve_factory, queue={"max_delayed": 10, "poll_interval": 0.2})
    too_many = await server.request("POST", "/runs/batch", json={"items": items(1001)})
    assert "<= 1000" in assert_error(too_many, 400)["detail"]
    empty = await server.request("POST", "/runs/batch", json={"items": []})
    assert_error(empty, 400)
    full = await server.request("POST", "/runs/batch", json={"items": items(11)})
    assert "max_delayed" in assert_error(full, 429, "queue_full")["detail"]
    assert await job_count(server) == 0
    text = await server.request(
        "POST", "/runs/batch", content=b"{}", headers={"Content-Type": "text/plain"}
    )
    assert_error(text, 415)


async def test_the_run_own_timeout_replaces_the_configured_one(
    serve_factory: ServeFactory,
) -> None:
    server = await start(serve_factory, queue={"timeout_seconds": 3600, "poll_interval": 0.2})
    response = await server.request(
        "POST", "/runs", json=submission("task/sleep", {"seconds": 30}, timeout_seconds=0.5)
    )
    assert response.status_code == 202, response.text
    run = await wait_status(server, response.json()["run_id"], "failed")
    assert run["timeout_seconds"] == 0.5
    assert "0.5" in (run["error"] or ""), run["error"]
    over = await server.request(
        "POST", "/runs", json=submission("task/echo", timeout_seconds=90_000)
    )
    assert "max_timeout_seconds" in assert_error(over, 400)["detail"]
