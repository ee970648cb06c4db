"""Who may follow which run: the visibility of ``GET /runs/{id}`` for events and ``?wait``.

An admin and the run's own user read everything; an approver sees the run's lifecycle but
no handler data; another user, and anyone asking about a service account's run without
admin or approve rights, gets 404, as for a run that does not exist.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import jwt
import pytest
from serve_harness import (  # fixtures are used by name
    ServeFactory,
    pg_ready,
    pg_serve_factory,
    pg_setup,
    runq_engine,
    runq_setup,
    serve_factory,
)

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["pg_ready", "pg_serve_factory", "pg_setup", "runq_engine", "runq_setup", "serve_factory"]

SECRET = "follow-jwt-secret-0123456789abcdef-0123456789abcdef-0123456789abcdef"
AUDIENCE = "runq-api"
ISSUER = "https://issuer.test"


def _token(sub: str, scope: str = "") -> dict[str, str]:
    claims: dict[str, Any] = {
        "sub": sub,
        "exp": int(time.time()) + 300,
        "aud": AUDIENCE,
        "iss": ISSUER,
    }
    if scope:
        claims["scope"] = scope
    return {"Authorization": "Bearer " + jwt.encode(claims, SECRET, algorithm="HS256")}


async def test_events_and_wait_follow_run_visibility(
    runq_setup: Any, serve_factory: ServeFactory
) -> None:
    route = "postgres" if runq_setup.engine == "postgres" else "local"
    config = {
        "queue": {"poll_interval": 0.1},
        "routing": {"*": route},
        "components": {"task/emit": "follow.follow_handlers:emit"},
        "privacy": {"level": "full"},
        "http": {
            "auth": "jwt",
            "jwt": {
                "secret": "env:RUNQ_TEST_FOLLOW_JWT",
                "audience": AUDIENCE,
                "issuer": ISSUER,
                "leeway_seconds": 0,
            },
        },
    }
    server = await serve_factory(config, env={"RUNQ_TEST_FOLLOW_JWT": SECRET})
    alice, bob = _token("alice"), _token("bob")
    admin, approver = _token("root", "runq:admin"), _token("carol", "runq:approve")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        submitted = await client.post(
            "/runs",
            json={"component_type": "task", "component_id": "emit", "payload": {"count": 2}},
            headers=alice,
        )
        assert submitted.status_code == 202, submitted.text
        run_id = submitted.json()["run_id"]
        for who, expected in ((bob, 404), (alice, 200), (admin, 200), (approver, 200)):
            waited = await client.get(f"/runs/{run_id}", params={"wait": 20}, headers=who)
            assert waited.status_code == expected, waited.text
            page = await client.get(f"/runs/{run_id}/events?stream=false", headers=who)
            assert page.status_code == expected, page.text
            async with client.stream("GET", f"/runs/{run_id}/events", headers=who) as stream:
                assert stream.status_code == expected
        assert (await client.get(f"/runs/{run_id}/events?stream=false")).status_code == 401

        def delta_data(body: dict[str, Any]) -> list[Any]:
            return [e["data"] for e in body["events"] if e["kind"] == "delta"]

        mine = (await client.get(f"/runs/{run_id}/events?stream=false", headers=alice)).json()
        assert delta_data(mine) == [{"i": 0, "text": ""}, {"i": 1, "text": ""}]
        seen = (await client.get(f"/runs/{run_id}/events?stream=false", headers=approver)).json()
        assert delta_data(seen) == [None, None]
        claimed = next(e for e in seen["events"] if e["kind"] == "claimed")
        assert claimed["data"]["attempt"] == 1  # lifecycle details are not content
        missing = "0190f1c2-0000-7000-8000-000000000000"
        for path in (f"/runs/{missing}/events?stream=false", f"/runs/{missing}?wait=1"):
            assert (await client.get(path, headers=admin)).status_code == 404
