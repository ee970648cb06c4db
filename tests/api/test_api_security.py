"""Auth modes and visibility against real daemons on both engines.

open (refused on a public address unless allowed), key (near misses), jwt (expired,
wrongly signed, wrong audience, scope-less, RS256), and who may read, cancel and continue
whose runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from api_support import (
    ADMIN_SCOPE,
    APPROVE_SCOPE,
    JWT_AUDIENCE,
    JWT_ISSUER,
    JWT_SECRET,
    api_config,
    assert_error,
    bearer,
    jwt_config,
    mint,
    server_env,
    submission,
    submit,
    wait_status,
)
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from serve_harness import (  # fixtures are used by name
    RunqServer,
    ServeFactory,
    free_port,
    runq_engine,
    runq_setup,
    serve_factory,
)

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]

API_KEY = "runq-test-key-5d0c2f8e9a7b41c3b6e1"


async def start_jwt(serve_factory: ServeFactory, **jwt_overrides: Any) -> RunqServer:
    return await serve_factory(
        jwt_config(**jwt_overrides), env=server_env({"RUNQ_TEST_JWT_SECRET": JWT_SECRET})
    )


async def start_key(serve_factory: ServeFactory, **queue: Any) -> RunqServer:
    config = api_config(http={"auth": "key", "key": "env:RUNQ_TEST_API_KEY"}, queue=queue)
    return await serve_factory(config, env=server_env({"RUNQ_TEST_API_KEY": API_KEY}))


# -- open ----------------------------------------------------------------------------------------


async def test_open_auth_is_refused_on_a_public_address_unless_allowed(
    serve_factory: ServeFactory,
) -> None:
    public = {"http": {"listen": f"0.0.0.0:{free_port()}"}}
    refused = await serve_factory(api_config(**public), env=server_env(), wait_ready=False)
    assert await refused.wait_exit() != 0
    assert "http.auth" in refused.logs()

    allowed = api_config(http={"listen": f"0.0.0.0:{free_port()}", "allow_open_on_public": True})
    server = await serve_factory(allowed, env=server_env())
    assert (await server.request("GET", "/queue/stats")).status_code == 200


# -- key -----------------------------------------------------------------------------------------


async def test_key_auth(serve_factory: ServeFactory) -> None:
    server = await start_key(serve_factory)
    missing = await server.request("POST", "/runs", json=submission())
    assert_error(missing, 401, "unauthorized")
    assert missing.headers["www-authenticate"].startswith("Bearer")
    near_misses = [
        API_KEY[:-1] + ("x" if API_KEY[-1] != "x" else "y"),
        API_KEY[:-1],
        API_KEY + "0",
        API_KEY.upper(),
    ]
    for near in near_misses:
        response = await server.request("POST", "/runs", json=submission(), headers=bearer(near))
        assert_error(response, 401, "unauthorized")
        assert_error(await server.request("GET", "/queue/stats", headers=bearer(near)), 401)
    basic = await server.request("GET", "/queue/stats", headers={"Authorization": API_KEY})
    assert_error(basic, 401)

    good = bearer(API_KEY)
    accepted = await submit(server, "agent/approve", {"q": 1}, headers=good)
    await wait_status(server, accepted["run_id"], "paused", headers=good)
    continued = await server.request(
        "POST", f"/runs/{accepted['run_id']}/continue", json={"decision": 1}, headers=good
    )
    assert continued.status_code == 200, continued.text
    done = await wait_status(server, accepted["run_id"], "completed", headers=good)
    # A key holder is an admin service account, frozen on the run and restored in the worker.
    assert done["answer"]["actor"] == {"user_id": None, "service_account": True, "scopes": []}
    assert done["payload"] == {"q": 1}
    assert (await server.request("GET", "/queue/stats", headers=good)).status_code == 200
    # Probes and the schema need no credentials.
    for path in ("/healthz", "/readyz", "/metrics", "/schema/openapi.json"):
        assert (await server.request("GET", path)).status_code == 200, path
    # Nothing was stored by the refused submissions.
    jobs = await server.request("GET", "/queue/jobs", headers=good)
    assert jobs.json()["meta"]["total_count"] == 1


async def test_worker_check_comes_before_authentication(serve_factory: ServeFactory) -> None:
    server = await start_key(serve_factory, worker=False)
    assert_error(await server.request("GET", "/queue/stats"), 503, "worker_disabled")
    assert_error(await server.request("POST", "/runs", json=submission()), 401)


# -- jwt -----------------------------------------------------------------------------------------


async def test_jwt_refusals_and_the_admin_scope(serve_factory: ServeFactory) -> None:
    server = await start_jwt(serve_factory)
    refusals = {
        "expired": mint(exp=int(time.time()) - 60),
        "signature": mint(secret="not-the-servers-secret-0123456789abcdef-0123456789abcdef-012"),
        "audience": mint(aud="someone-else"),
        "issuer": mint(iss="https://other.issuer"),
        "not valid": "abc.def.ghi",
    }
    for reason, token in refusals.items():
        response = await server.request("POST", "/runs", json=submission(), headers=bearer(token))
        assert reason in assert_error(response, 401, "unauthorized")["detail"], reason
    assert_error(await server.request("POST", "/runs", json=submission()), 401)

    plain = bearer(mint("dora"))  # no scope at all
    await submit(server, headers=plain)
    for path in ("/queue/stats", "/queue/jobs", "/queue/jobs/x"):
        assert_error(await server.request("GET", path, headers=plain), 403, "forbidden")
    approver = bearer(mint("carol", scope=APPROVE_SCOPE))
    assert_error(await server.request("GET", "/queue/stats", headers=approver), 403)
    admin = bearer(mint("root", scope=f"openid {ADMIN_SCOPE}"))
    stats = await server.request("GET", "/queue/stats", headers=admin)
    assert stats.status_code == 200, stats.text
    assert sum(stats.json()["counts"].values()) == 1  # refused requests stored nothing


async def test_jwt_rs256_with_a_public_key_file(
    serve_factory: ServeFactory, tmp_path: Path
) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = tmp_path / "jwt-public.pem"
    pem.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    server = await start_jwt(serve_factory, algorithms=["RS256"], public_key=f"file:{pem}")
    claims = {
        "sub": "erin",
        "exp": int(time.time()) + 300,
        "aud": JWT_AUDIENCE,
        "iss": JWT_ISSUER,
        "scope": ADMIN_SCOPE,
    }
    good = bearer(jwt.encode(claims, private, algorithm="RS256"))
    assert (await server.request("GET", "/queue/stats", headers=good)).status_code == 200
    forged = bearer(jwt.encode(claims, stranger, algorithm="RS256"))
    response = await server.request("GET", "/queue/stats", headers=forged)
    assert "signature" in assert_error(response, 401)["detail"]
    hs = bearer(mint(scope=ADMIN_SCOPE))  # an HS256 token must not pass an RS256 server
    assert_error(await server.request("GET", "/queue/stats", headers=hs), 401)


# -- visibility ----------------------------------------------------------------------------------


async def test_visibility_of_runs_between_users(serve_factory: ServeFactory) -> None:
    server = await start_jwt(serve_factory)
    alice = bearer(mint("alice", scope="profile"))
    bob = bearer(mint("bob"))
    carol = bearer(mint("carol", scope=APPROVE_SCOPE))
    admin = bearer(mint("root", scope=ADMIN_SCOPE))

    accepted = await submit(server, "agent/approve", {"secret": "alice's"}, headers=alice)
    run_id = accepted["run_id"]
    paused = await wait_status(server, run_id, "paused", headers=alice)
    assert paused["payload"] == {"secret": "alice's"}

    # Another user: the run does not exist for them.
    assert_error(await server.request("GET", f"/runs/{run_id}", headers=bob), 404)
    assert_error(await server.request("POST", f"/runs/{run_id}/cancel", headers=bob), 404)
    continue_path = f"/runs/{run_id}/continue"
    assert_error(
        await server.request("POST", continue_path, json={"decision": "x"}, headers=bob), 404
    )

    # An approver sees it and may continue it, but gets neither payload nor answer.
    seen = await server.request("GET", f"/runs/{run_id}", headers=carol)
    assert seen.status_code == 200
    assert "payload" not in seen.json()
    assert "answer" not in seen.json()
    assert seen.json()["user_id"] == "alice"
    assert_error(await server.request("POST", f"/runs/{run_id}/cancel", headers=carol), 403)
    continued = await server.request(
        "POST", continue_path, json={"decision": "approved"}, headers=carol
    )
    assert continued.status_code == 200, continued.text
    assert "payload" not in continued.json()

    done = await wait_status(server, run_id, "completed", headers=alice)
    # The actor frozen at submission is the one the worker ran as.
    assert done["answer"] == {
        "decision": "approved",
        "actor": {"user_id": "alice", "service_account": False, "scopes": ["profile"]},
    }
    after = (await server.request("GET", f"/runs/{run_id}", headers=carol)).json()
    assert "answer" not in after
    everything = (await server.request("GET", f"/runs/{run_id}", headers=admin)).json()
    assert everything["payload"] == {"secret": "alice's"}
    assert everything["answer"]["decision"] == "approved"
    job = await server.request("GET", f"/queue/jobs/{run_id}", headers=admin)
    assert job.json()["user_id"] == "alice"


async def test_owners_cancel_and_continue_their_own_runs(serve_factory: ServeFactory) -> None:
    server = await start_jwt(serve_factory)
    alice = bearer(mint("alice"))
    bob = bearer(mint("bob"))
    mine = await submit(server, "agent/approve", {}, headers=alice)
    await wait_status(server, mine["run_id"], "paused", headers=alice)
    response = await server.request(
        "POST", f"/runs/{mine['run_id']}/continue", json={"decision": 1}, headers=alice
    )
    assert response.status_code == 200, response.text
    queued = await submit(server, delay_seconds=3600, headers=alice)
    response = await server.request("POST", f"/runs/{queued['run_id']}/cancel", headers=alice)
    assert response.json()["status"] == "cancelled"

    # Idempotency keys are per user: the same key from bob is bob's own run.
    key = {"Idempotency-Key": "shared-key"}
    a = await submit(server, delay_seconds=3600, headers={**alice, **key})
    b = await submit(server, delay_seconds=3600, headers={**bob, **key})
    assert a["run_id"] != b["run_id"]
    assert_error(await server.request("GET", f"/runs/{a['run_id']}", headers=bob), 404)
