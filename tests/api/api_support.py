"""Shared by the API tests: config for real servers, JWT minting, waiting on runs."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import jwt
from helpers import wait_for
from serve_harness import REPO_DIR, TESTS_DIR, RunqServer

from runq.ids import new_run_id
from runq.model import Actor, Run, Status

API_TESTS_DIR = Path(__file__).resolve().parent
JWT_SECRET = "jwt-test-secret-0123456789abcdef-0123456789abcdef-0123456789abcdef"
JWT_AUDIENCE = "runq-api"
JWT_ISSUER = "https://issuer.test"
ADMIN_SCOPE = "runq:admin"
APPROVE_SCOPE = "runq:approve"
#: Timeouts for conditions on a live daemon (runs finish in milliseconds normally).
SETTLE = 20.0


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """PYTHONPATH for daemons that load ``api_handlers`` (plus the harness's own paths)."""
    paths = [str(API_TESTS_DIR), str(TESTS_DIR), str(REPO_DIR), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p), **(extra or {})}


def api_config(**sections: Any) -> dict[str, Any]:
    """A daemon config for API tests: the approve component, every route woken locally
    (or by NOTIFY, the harness does not care), quick polls; ``sections`` merge on top."""
    config: dict[str, Any] = {
        "queue": {"poll_interval": 0.2},
        "routing": {"*": "local"},
        "components": {"agent/approve": "api_handlers:approve"},
        # The approve handler answers with what it received on resume; these tests read it.
        "privacy": {"keep_answer_after_approval": True},
    }
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    return config


def jwt_config(**jwt_overrides: Any) -> dict[str, Any]:
    jwt_section = {
        "secret": "env:RUNQ_TEST_JWT_SECRET",
        "audience": JWT_AUDIENCE,
        "issuer": JWT_ISSUER,
        "leeway_seconds": 0,
        **jwt_overrides,
    }
    return api_config(http={"auth": "jwt", "jwt": jwt_section})


def mint(sub: str = "alice", *, scope: str = "", secret: str = JWT_SECRET, **claims: Any) -> str:
    """An HS256 token the jwt_config server accepts unless ``claims`` spoil it."""
    base: dict[str, Any] = {
        "sub": sub,
        "exp": int(time.time()) + 300,
        "aud": JWT_AUDIENCE,
        "iss": JWT_ISSUER,
    }
    if scope:
        base["scope"] = scope
    base.update(claims)
    return jwt.encode({k: v for k, v in base.items() if v is not None}, secret, algorithm="HS256")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def submission(component: str = "task/echo", payload: Any = None, **fields: Any) -> dict[str, Any]:
    component_type, _, component_id = component.partition("/")
    body: dict[str, Any] = {"component_type": component_type, "component_id": component_id}
    body["payload"] = payload
    body.update(fields)
    return body


async def submit(
    server: RunqServer,
    component: str = "task/echo",
    payload: Any = None,
    *,
    headers: dict[str, str] | None = None,
    expect: int = 202,
    **fields: Any,
) -> dict[str, Any]:
    response = await server.request(
        "POST", "/runs", json=submission(component, payload, **fields), headers=headers
    )
    assert response.status_code == expect, response.text
    body: dict[str, Any] = response.json()
    return body


async def wait_status(
    server: RunqServer, run_id: str, *statuses: str, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Poll ``GET /runs/{id}`` until its status is one of ``statuses``; the run's body."""

    async def reached() -> dict[str, Any] | None:
        response = await server.request("GET", f"/runs/{run_id}", headers=headers)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body if body["status"] in statuses else None

    result: dict[str, Any] = await wait_for(
        reached, timeout=SETTLE, message=f"run {run_id} reaches {'/'.join(statuses)}"
    )
    return result


def assert_error(response: httpx.Response, status: int, error: str | None = None) -> dict[str, Any]:
    """A JSON error answer of the documented shape."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body: dict[str, Any] = response.json()
    assert set(body) == {"error", "detail"}, body
    assert isinstance(body["detail"], str)
    assert body["detail"]
    if error is not None:
        assert body["error"] == error, body
    return body


def make_run(*, user_id: str | None, status: Status = Status.QUEUED, **fields: Any) -> Run:
    """A ``Run`` value (not stored) for checks that only look at its fields."""
    now = 1_700_000_000.0
    values: dict[str, Any] = {
        "id": new_run_id(),
        "component_type": "task",
        "component_id": "echo",
        "status": status,
        "attempt": 0,
        "max_attempts": 1,
        "priority": 0,
        "session_id": None,
        "user_id": user_id,
        "actor": Actor(user_id=user_id),
        "configuration": None,
        "deployment_id": None,
        "idempotency_key": None,
        "origin": "http",
        "created_at": now,
        "updated_at": now,
        "available_at": now,
        "started_at": None,
        "completed_at": None,
        "locked_by": None,
        "locked_at": None,
        "error": None,
        "termination_reason": None,
        "pause_reason": None,
        "cancel_requested": False,
        "non_idempotent": False,
        "has_request": True,
        "payload": {"secret": "payload"},
        "answer": {"secret": "answer"},
    }
    values.update(fields)
    return Run(**values)
