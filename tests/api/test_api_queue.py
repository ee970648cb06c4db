"""``/queue`` (the operator surface), health, metrics and the OpenAPI document, against real daemons
on both engines."""

from __future__ import annotations

import math
import sqlite3
from typing import Any

import asyncpg
import pytest
from api_support import SETTLE, api_config, assert_error, server_env, submit, wait_status
from conftest import PG_URL
from helpers import wait_for
from serve_harness import (  # fixtures are used by name
    RunqServer,
    RunqSetup,
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


async def get_json(server: RunqServer, path: str, **params: Any) -> Any:
    response = await server.request("GET", path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


async def make_mixed_jobs(server: RunqServer) -> dict[str, list[str]]:
    """Completed, failed, cancelled and queued jobs; ids by status."""
    ids: dict[str, list[str]] = {"completed": [], "failed": [], "cancelled": [], "queued": []}
    for i in range(3):
        ids["completed"].append((await submit(server, "task/echo", {"i": i}))["run_id"])
    failed = await submit(server, "task/fail", {"message": "no", "permanent": True})
    ids["failed"].append(failed["run_id"])
    for _ in range(2):
        ids["queued"].append((await submit(server, delay_seconds=FAR_FUTURE))["run_id"])
    cancelled = await submit(server, delay_seconds=FAR_FUTURE)
    await server.request("POST", f"/runs/{cancelled['run_id']}/cancel")
    ids["cancelled"].append(cancelled["run_id"])
    for status in ("completed", "failed"):
        for run_id in ids[status]:
            await wait_status(server, run_id, status)
    return ids


async def test_stats_and_listing(serve_factory: ServeFactory) -> None:
    server = await start(serve_factory)
    ids = await make_mixed_jobs(server)
    total = sum(len(v) for v in ids.values())

    stats = await get_json(server, "/queue/stats")
    assert stats["counts"] == {k: len(v) for k, v in ids.items()}
    assert stats["oldest_queued_age_seconds"] is None  # delayed runs are not waiting yet

    listing = await get_json(server, "/queue/jobs")
    assert listing["meta"] == {"page": 1, "limit": 20, "total_count": total, "total_pages": 1}
    job = listing["data"][0]
    for field in (
        "id", "component_type", "component_id", "session_id", "user_id", "status", "attempt",
        "max_attempts", "error", "locked_by", "locked_at", "idempotency_key", "payload",
        "created_at", "updated_at", "completed_at", "deployment_id", "available_at",
        "priority", "termination_reason", "pause_reason",
    ):  # fmt: skip
        assert field in job, field

    dead = await get_json(server, "/queue/jobs", status="failed")
    assert [j["id"] for j in dead["data"]] == ids["failed"]
    assert dead["data"][0]["termination_reason"] == "not_retryable"
    both = await server.request(
        "GET", "/queue/jobs", params=[("status", "failed"), ("status", "cancelled")]
    )
    assert {j["id"] for j in both.json()["data"]} == set(ids["failed"] + ids["cancelled"])

    paged = await get_json(server, "/queue/jobs", limit=2, page=2)
    assert len(paged["data"]) == 2
    assert paged["meta"]["total_pages"] == math.ceil(total / 2)
    past = await get_json(server, "/queue/jobs", limit=2, page=99)
    assert past["data"] == []
    assert past["meta"]["total_count"] == total

    newest_first = [j["id"] for j in (await get_json(server, "/queue/jobs"))["data"]]
    oldest_first = [
        j["id"] for j in (await get_json(server, "/queue/jobs", sort_order="asc"))["data"]
    ]
    assert oldest_first == list(reversed(newest_first))
    ignored = await get_json(server, "/queue/jobs", sort_by="no_such_field")
    assert [j["id"] for j in ignored["data"]] == newest_first
    by_component = await get_json(server, "/queue/jobs", sort_by="component_id", sort_order="asc")
    names = [j["component_id"] for j in by_component["data"]]
    assert names == sorted(names)


BAD_LISTING_PARAMS: list[dict[str, Any]] = [
    {"limit": 0},
    {"limit": 1001},
    {"limit": "ten"},
    {"page": 0},
    {"status": "bogus"},
    {"sort_order": "sideways"},
]


async def test_listing_refuses_bad_parameters(serve_factory: ServeFactory) -> None:
    server = await start(serve_factory)
    for params in BAD_LISTING_PARAMS:
        response = await server.request("GET", "/queue/jobs", params=params)
        detail = assert_error(response, 400, "bad_request")["detail"]
        assert next(iter(params)) in detail, (params, detail)


async def test_one_job_and_requeue(serve_factory: ServeFactory) -> None:
    server = await start(serve_factory, queue={"lock_grace_seconds": 3})
    failed = await submit(server, "task/fail", {"message": "once", "permanent": True})
    await wait_status(server, failed["run_id"], "failed")
    job = await get_json(server, f"/queue/jobs/{failed['run_id']}")
    assert job["payload"] == {"message": "once", "permanent": True}
    assert job["status"] == "failed"
    assert_error(await server.request("GET", "/queue/jobs/nope"), 404, "not_found")

    # Within lock_grace_seconds of the failure: 409 unless forced, then it passes.
    requeue = f"/queue/jobs/{failed['run_id']}/requeue"
    assert_error(await server.request("POST", requeue), 409, "conflict")

    async def requeued() -> bool:
        response = await server.request("POST", requeue)
        assert response.status_code in (200, 409), response.text
        return response.status_code == 200

    await wait_for(requeued, timeout=SETTLE, message="requeue passes after the grace")
    again = await wait_status(server, failed["run_id"], "failed")
    assert again["attempt"] == 2
    assert again["max_attempts"] == 2
    forced = await server.request("POST", requeue, params={"force": "true"})
    assert forced.status_code == 200, forced.text
    assert forced.json()["status"] == "queued"
    assert forced.json()["max_attempts"] == 3

    queued = await submit(server, delay_seconds=FAR_FUTURE)
    refused = await server.request("POST", f"/queue/jobs/{queued['run_id']}/requeue")
    assert_error(refused, 400, "invalid_transition")
    assert_error(await server.request("POST", "/queue/jobs/nope/requeue"), 404, "not_found")
    flag = await server.request("POST", requeue, params={"force": "maybe"})
    assert_error(flag, 400, "bad_request")


async def test_requeue_of_a_cancelled_job_keeps_the_cancel_unless_cleared(
    serve_factory: ServeFactory,
) -> None:
    server = await start(serve_factory)
    kept = await submit(server, "task/sleep", {"seconds": 0.1}, delay_seconds=FAR_FUTURE)
    cleared = await submit(server, "task/sleep", {"seconds": 0.1}, delay_seconds=FAR_FUTURE)
    for run in (kept, cleared):
        await server.request("POST", f"/runs/{run['run_id']}/cancel")

    response = await server.request("POST", f"/queue/jobs/{kept['run_id']}/requeue")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "queued"
    response = await server.request(
        "POST", f"/queue/jobs/{cleared['run_id']}/requeue", params={"clear_cancellation": "true"}
    )
    assert response.status_code == 200, response.text

    # The recorded cancel stops the re-driven attempt at its first checkpoint, visibly.
    again = await wait_status(server, kept["run_id"], "cancelled")
    assert again["attempt"] == 1
    done = await wait_status(server, cleared["run_id"], "completed")
    assert done["answer"] == {"slept": 0.1}


async def test_a_replica_without_a_worker_answers_503_on_every_queue_path(
    serve_factory: ServeFactory,
) -> None:
    server = await start(serve_factory, queue={"worker": False})
    accepted = await submit(server, "task/echo", {"x": 1})
    for method, path in (
        ("GET", "/queue/stats"),
        ("GET", "/queue/jobs"),
        ("GET", "/queue/jobs?status=bogus"),
        ("GET", f"/queue/jobs/{accepted['run_id']}"),
        ("POST", f"/queue/jobs/{accepted['run_id']}/requeue"),
    ):
        assert_error(await server.request(method, path), 503, "worker_disabled")
    # The runs surface still works: the run waits for a replica that has a worker.
    run = await server.request("GET", f"/runs/{accepted['run_id']}")
    assert run.json()["status"] == "queued"


async def test_health_metrics_and_openapi(serve_factory: ServeFactory) -> None:
    server = await start(serve_factory)
    assert (await get_json(server, "/healthz")) == {"status": "ok", "detail": ""}
    assert (await get_json(server, "/readyz"))["status"] == "ready"
    metrics = await server.request("GET", "/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert metrics.headers["content-type"].count("charset") == 1
    assert "runq_" in metrics.text

    document = await get_json(server, "/schema/openapi.json")
    assert document["openapi"].startswith("3.")
    assert set(document["paths"]) >= {
        "/runs", "/runs/{run_id}", "/runs/{run_id}/cancel", "/runs/{run_id}/continue",
        "/queue/stats", "/queue/jobs", "/queue/jobs/{job_id}", "/queue/jobs/{job_id}/requeue",
        "/healthz", "/readyz", "/metrics",
    }  # fmt: skip
    assert_error(await server.request("GET", "/no/such/path"), 404, "not_found")
    assert_error(await server.request("DELETE", "/runs"), 405, "method_not_allowed")


async def drop_latest_migration(setup: RunqSetup) -> None:
    """Make the schema look one migration behind, as after a downgrade gone wrong."""
    if setup.engine == "postgres":
        conn = await asyncpg.connect(PG_URL)
        try:
            table = f"{setup.schema}.schema_migrations"
            await conn.execute(
                f"DELETE FROM {table} WHERE version = (SELECT max(version) FROM {table})"
            )
        finally:
            await conn.close()
        return
    path = setup.store_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        table = f"{setup.schema}_schema_migrations"
        conn.execute(f"DELETE FROM {table} WHERE version = (SELECT max(version) FROM {table})")


async def test_readyz_is_503_when_migrations_are_not_current(
    serve_factory: ServeFactory, runq_setup: RunqSetup
) -> None:
    server = await start(serve_factory)
    assert (await server.request("GET", "/readyz")).status_code == 200
    await drop_latest_migration(runq_setup)
    response = await server.request("GET", "/readyz")
    assert "schema" in assert_error(response, 503, "not_ready")["detail"]
    assert (await server.request("GET", "/healthz")).status_code == 200  # still alive
