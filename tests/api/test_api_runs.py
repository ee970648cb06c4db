"""``/runs`` against real ``runq serve`` processes on both engines (open auth).

Submission (202, idempotency, 409, 422, 429, 400, 413), the sync route (200), reads,
cancel and continue with every status code, bad input that stores nothing, and payloads
that never reach the log.
"""

from __future__ import annotations

from typing import Any

import pytest
from api_support import (
    SETTLE,
    api_config,
    assert_error,
    server_env,
    submission,
    submit,
    wait_status,
)
from helpers import wait_for
from serve_harness import (  # fixtures are used by name
    RunqServer,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]

FAR_FUTURE = 3600.0  # delay_seconds that keeps a run queued for the whole test


async def start(serve_factory: ServeFactory, **sections: Any) -> RunqServer:
    return await serve_factory(api_config(**sections), env=server_env())


async def job_count(server: RunqServer) -> int:
    response = await server.request("GET", "/queue/jobs", params={"limit": 1})
    assert response.status_code == 200, response.text
    count: int = response.json()["meta"]["total_count"]
    return count


async def test_submit_read_and_idempotency(serve_factory: ServeFactory) -> None:
    server = await start(serve_factory)
    response = await server.request(
        "POST",
        "/runs",
        json=submission("task/echo", {"n": 1}, session_id="s-1"),
        headers={"Idempotency-Key": "key-1"},
    )
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert set(accepted) == {"run_id", "session_id", "status", "created"}
    assert accepted["created"] is True
    assert accepted["session_id"] == "s-1"
    assert accepted["status"] == "queued"
    assert response.headers["location"] == f"/runs/{accepted['run_id']}"

    run = await wait_status(server, accepted["run_id"], "completed")
    assert run["payload"] == {"n": 1}
    assert run["answer"] == {"n": 1}  # privacy level "metadata" keeps the answer
    assert run["user_id"] is None
    assert run["idempotency_key"] == "key-1"

    again = await server.request(
        "POST",
        "/runs",
        json=submission("task/echo", {"n": 2}),
        headers={"Idempotency-Key": "key-1"},
    )
    assert again.status_code == 202
    assert again.json()["run_id"] == accepted["run_id"]
    assert again.json()["status"] == "completed"  # the original run, as it is now
    assert again.headers["idempotent-replayed"] == "true"

    other = await server.request(
        "POST", "/runs", json=submission("task/sleep"), headers={"Idempotency-Key": "key-1"}
    )
    assert_error(other, 409, "idempotency_conflict")
    assert await job_count(server) == 1

    missing = await server.request("GET", "/runs/01890000-0000-7000-8000-000000000000")
    assert_error(missing, 404, "not_found")
    assert_error(await server.request("GET", "/runs/%00"), 404, "not_found")


async def test_idempotency_key_length(serve_factory: ServeFactory) -> None:
    server = await start(serve_factory)
    longest = "k" * 512
    ok = await server.request(
        "POST", "/runs", json=submission(), headers={"Idempotency-Key": longest}
    )
    assert ok.status_code == 202, ok.text
    too_long = await server.request(
        "POST", "/runs", json=submission(), headers={"Idempotency-Key": longest + "k"}
    )
    assert_error(too_long, 422, "invalid_idempotency_key")
    blank = await server.request(
        "POST", "/runs", json=submission(), headers={"Idempotency-Key": ""}
    )
    assert_error(blank, 400, "bad_request")
    assert await job_count(server) == 1


async def test_queue_full_answers_429_but_still_answers_duplicates(
    serve_factory: ServeFactory,
) -> None:
    server = await start(serve_factory, queue={"max_queue_depth": 2, "max_delayed": 2})
    first = await server.request(
        "POST",
        "/runs",
        json=submission(delay_seconds=FAR_FUTURE),
        headers={"Idempotency-Key": "first"},
    )
    assert first.status_code == 202
    await submit(server, delay_seconds=FAR_FUTURE)
    full = await server.request("POST", "/runs", json=submission(delay_seconds=FAR_FUTURE))
    assert_error(full, 429, "queue_full")
    assert full.headers["retry-after"].isdigit()
    duplicate = await server.request(
        "POST",
        "/runs",
        json=submission(delay_seconds=FAR_FUTURE),
        headers={"Idempotency-Key": "first"},
    )
    assert duplicate.status_code == 202, duplicate.text
    assert duplicate.json()["run_id"] == first.json()["run_id"]
    assert await job_count(server) == 2


#: (body, a fragment the 400's detail must contain): each names what is wrong with it.
BAD_BODIES: list[tuple[Any, str]] = [
    (submission("task/nope"), "task/nope"),
    (submission("robot/echo"), "component_type"),
    ({"component_type": "task"}, "component_id"),
    (submission(priority="high"), "priority"),
    (submission(priority=2**40), "priority"),
    (submission(max_attempts=0), "max_attempts"),
    (submission(delay_seconds=-1), "delay_seconds"),
    (submission(background="yes"), "background"),
    (submission(session_id="a\u0000b"), "session_id"),
    (submission(deployment_id="x" * 201), "deployment_id"),
    (submission(surprise=1), "surprise"),
    ([], "object"),
    ("just a string", "object"),
]


async def test_bad_bodies_are_400_with_a_reason_and_store_nothing(
    serve_factory: ServeFactory,
) -> None:
    server = await start(serve_factory)
    for body, fragment in BAD_BODIES:
        response = await server.request("POST", "/runs", json=body)
        error = assert_error(response, 400)
        assert fragment in error["detail"], (body, error)
    assert await job_count(server) == 0


async def test_malformed_json_oversized_bodies_and_payloads_stay_out_of_logs(
    serve_factory: ServeFactory,
) -> None:
    server = await start(serve_factory, http={"max_body_bytes": 4096})
    marker = "PAYLOAD-MARKER-7f3a9c"
    malformed = await server.request(
        "POST",
        "/runs",
        content=b'{"component_type": "task", "payload": "' + marker.encode(),
        headers={"content-type": "application/json"},
    )
    assert "not valid JSON" in assert_error(malformed, 400, "bad_request")["detail"]

    oversized = submission(payload={"blob": marker * 1000})
    too_big = await server.request("POST", "/runs", json=oversized)
    assert_error(too_big, 413, "payload_too_large")
    wrong_type = await server.request(
        "POST", "/runs", json=submission(payload=marker, priority=marker)
    )
    assert_error(wrong_type, 400)
    assert await job_count(server) == 0

    # A run that executes and completes with the marker in payload and answer.
    accepted = await submit(server, "task/echo", {"secret": marker})
    await wait_status(server, accepted["run_id"], "completed")
    await submit(server, "task/echo", {"secret": marker}, background=False, expect=202)
    assert marker not in server.logs()


async def test_background_false_on_a_sync_route_runs_in_the_request(
    serve_factory: ServeFactory,
) -> None:
    server = await start(serve_factory, routing={"task/echo": "sync", "task/fail": "sync"})
    response = await server.request(
        "POST", "/runs", json=submission("task/echo", {"hi": 1}, background=False)
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed"
    assert body["answer"] == {"hi": 1}
    assert body["termination_reason"] == "completed"

    failed = await server.request(
        "POST",
        "/runs",
        json=submission("task/fail", {"message": "boom", "permanent": True}, background=False),
    )
    assert failed.status_code == 200, failed.text
    assert failed.json()["status"] == "failed"
    assert "boom" in failed.json()["error"]

    # background (the default) on the same route never executes in the request.
    deferred = await server.request(
        "POST", "/runs", json=submission("task/echo", delay_seconds=FAR_FUTURE)
    )
    assert deferred.status_code == 202
    assert deferred.json()["status"] == "queued"
    # background false on a non-sync route: stored and woken, answered 202.
    local = await server.request(
        "POST", "/runs", json=submission("task/sleep", {"seconds": 0}, background=False)
    )
    assert local.status_code == 202, local.text


async def test_cancel(serve_factory: ServeFactory) -> None:
    server = await start(serve_factory)
    queued = await submit(server, delay_seconds=FAR_FUTURE)
    cancelled = await server.request("POST", f"/runs/{queued['run_id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    again = await server.request("POST", f"/runs/{queued['run_id']}/cancel")
    assert again.status_code == 200
    assert again.json()["status"] == "cancelled"

    running = await submit(server, "task/sleep", {"seconds": 30})
    await wait_status(server, running["run_id"], "running")
    recorded = await server.request("POST", f"/runs/{running['run_id']}/cancel")
    assert recorded.status_code == 200, recorded.text
    assert recorded.json()["cancel_requested"] is True
    await wait_status(server, running["run_id"], "cancelled")

    done = await submit(server, "task/echo", {"x": 1})
    await wait_status(server, done["run_id"], "completed")
    assert_error(await server.request("POST", f"/runs/{done['run_id']}/cancel"), 409, "conflict")
    assert_error(await server.request("POST", "/runs/no-such-run/cancel"), 404, "not_found")


async def test_continue(serve_factory: ServeFactory) -> None:
    server = await start(serve_factory)
    paused = await submit(server, "agent/approve", {"linger": 2})
    run = await wait_status(server, paused["run_id"], "paused")
    assert run["pause_reason"] == "approval"
    run_id = paused["run_id"]

    first = await server.request("POST", f"/runs/{run_id}/continue", json={"decision": "yes"})
    assert first.status_code == 200, first.text
    assert first.json()["status"] in ("queued", "running")
    # A second continue of the same pause: the same run, nothing changes.
    second = await server.request("POST", f"/runs/{run_id}/continue", json={"decision": "no"})
    assert second.status_code == 200, second.text
    assert second.json()["id"] == run_id
    assert second.json()["status"] in ("queued", "running")
    finished = await wait_status(server, run_id, "completed")
    assert finished["answer"]["decision"] == "yes"
    assert_error(
        await server.request("POST", f"/runs/{run_id}/continue", json={"decision": 1}), 409
    )

    never_paused = await submit(server, delay_seconds=FAR_FUTURE)
    response = await server.request("POST", f"/runs/{never_paused['run_id']}/continue", json={})
    assert_error(response, 409, "conflict")
    bad = await server.request(
        "POST", f"/runs/{never_paused['run_id']}/continue", json={"decision": 1, "extra": 2}
    )
    assert_error(bad, 400)
    assert_error(await server.request("POST", "/runs/nope/continue", json={"decision": 1}), 404)

    # No body at all is a continue with a null decision.
    other = await submit(server, "agent/approve", {})
    await wait_status(server, other["run_id"], "paused")
    bare = await server.request("POST", f"/runs/{other['run_id']}/continue")
    assert bare.status_code == 200, bare.text
    done = await wait_status(server, other["run_id"], "completed")
    assert done["answer"]["decision"] is None


async def test_submitted_runs_are_woken_and_completed(serve_factory: ServeFactory) -> None:
    """Runs submitted over HTTP wake the daemon's own claimers."""
    server = await start(serve_factory)
    ids = [(await submit(server, "task/echo", {"i": i}))["run_id"] for i in range(5)]

    async def all_done() -> bool:
        response = await server.request(
            "GET", "/queue/jobs", params={"status": "completed", "limit": 10}
        )
        total: int = response.json()["meta"]["total_count"]
        return total == len(ids)

    await wait_for(all_done, timeout=SETTLE, message="five echo runs complete")
