"""Hostile HTTP input against real daemons on both engines, one test per finding.

A web page in the operator's browser must not drive the API (Host, Origin, Content-Type);
nested JSON, control characters in headers and out-of-range priorities are refused with a
4xx that says why, never a 500, and a refused request stores nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from api_support import (
    ADMIN_SCOPE,
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
from serve_harness import (  # fixtures are used by name
    RunqServer,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]

FOREIGN_ORIGIN = "http://attacker.example"


async def stored_runs(server: RunqServer, headers: dict[str, str] | None = None) -> int:
    response = await server.request("GET", "/queue/stats", headers=headers)
    assert response.status_code == 200, response.text
    return int(sum(response.json()["counts"].values()))


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


async def test_open_mode_cannot_be_driven_by_a_web_page(serve_factory: ServeFactory) -> None:
    server = await serve_factory(api_config(), env=server_env())
    port = server.listen.rsplit(":", 1)[1]
    body = '{"component_type": "task", "component_id": "echo"}'

    # A cross-site form post: text/plain needs no CORS preflight, so the browser sends it.
    form_post = await server.request(
        "POST", "/runs", content=body, headers={"content-type": "text/plain"}
    )
    assert "application/json" in assert_error(form_post, 415, "unsupported_media_type")["detail"]
    no_type = await server.request("POST", "/runs", content=body, headers={"content-type": ""})
    assert_error(no_type, 415)
    # A page elsewhere posting JSON (fetch with no-cors, or a preflight it ignores).
    for origin in (FOREIGN_ORIGIN, f"http://127.0.0.1:{int(port) + 1}", "null"):
        cross = await server.request("POST", "/runs", json=submission(), headers={"Origin": origin})
        assert_error(cross, 403, "origin_not_allowed")
        cancel = await server.request("POST", "/runs/x/cancel", headers={"Origin": origin})
        assert_error(cancel, 403, "origin_not_allowed")
    # DNS rebinding: attacker.example now resolves to 127.0.0.1.
    for path in ("/queue/jobs", "/runs/x", "/metrics"):
        rebound = await server.request("GET", path, headers={"Host": f"attacker.example:{port}"})
        assert "attacker.example" in assert_error(rebound, 421, "host_not_allowed")["detail"]
    assert await stored_runs(server) == 0

    # What the operator's own tools send still works: no Origin, or the server's own; the
    # listen address, localhost or any IP as Host (a Prometheus scrape names its target).
    same_origin = {"Origin": f"http://127.0.0.1:{port}"}
    await submit(server, headers=same_origin)
    vendor_json = await server.request(
        "POST", "/runs", content=body, headers={"content-type": "application/vnd.runq+json"}
    )
    assert vendor_json.status_code == 202, vendor_json.text
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "10.1.2.3:9100"):
        for path in ("/healthz", "/readyz", "/metrics"):
            probe = await server.request("GET", path, headers={"Host": host})
            assert probe.status_code == 200, (host, path, probe.text)
    assert await stored_runs(server) == 2


async def test_allowed_hosts_adds_the_names_clients_use(serve_factory: ServeFactory) -> None:
    server = await serve_factory(
        api_config(http={"allowed_hosts": ["runq.internal"]}), env=server_env()
    )
    named = await server.request("GET", "/metrics", headers={"Host": "runq.internal"})
    assert named.status_code == 200, named.text
    behind_proxy = {"Host": "runq.internal", "Origin": "https://runq.internal"}
    await submit(server, headers=behind_proxy)
    assert_error(await server.request("GET", "/metrics", headers={"Host": "other.internal"}), 421)


async def test_bad_input_is_a_4xx_never_a_500_deeply_nested_json(
    serve_factory: ServeFactory,
) -> None:
    server = await serve_factory(api_config(), env=server_env())
    json_headers = {"content-type": "application/json"}
    bodies = {
        "payload": '{"component_type": "task", "component_id": "echo", "payload": VALUE}',
        "body": "VALUE",
    }
    for where, template in bodies.items():
        for depth in (5000, 101):
            response = await server.request(
                "POST",
                "/runs",
                content=template.replace("VALUE", nested(depth)),
                headers=json_headers,
            )
            assert "deeper than 100" in assert_error(response, 400, "bad_request")["detail"], where
    paused = await submit(server, "agent/approve", {"q": 1})
    await wait_status(server, paused["run_id"], "paused")
    deep_decision = await server.request(
        "POST",
        f"/runs/{paused['run_id']}/continue",
        content=f'{{"decision": {nested(5000)}}}',
        headers=json_headers,
    )
    assert_error(deep_decision, 400, "bad_request")
    assert await stored_runs(server) == 1

    # The deepest accepted value goes all the way: stored, sealed, run and read back.
    deepest: Any = []
    for _ in range(98):  # 99 levels, plus the body object around it: 100
        deepest = [deepest]
    accepted = await submit(server, "task/echo", deepest)
    done = await wait_status(server, accepted["run_id"], "completed")
    assert done["payload"] == deepest
    assert "Traceback" not in server.logs()


async def test_idempotency_key_with_control_characters_is_refused(
    serve_factory: ServeFactory,
) -> None:
    server = await serve_factory(api_config(), env=server_env())
    refused_keys: list[bytes] = [
        b"key\twith-tab",
        b"csi-\x9b31m",  # a lone C1 byte: not UTF-8
        "osc-\u009b52;c;".encode(),  # C1 CSI as UTF-8: a control character
        "bidi-\u202eevil".encode(),  # right-to-left override: invisible in a terminal
    ]
    for refused_key in refused_keys:
        response = await server.request(
            "POST", "/runs", json=submission(), headers={"Idempotency-Key": refused_key}
        )
        assert_error(response, 400, "bad_request")
    assert await stored_runs(server) == 0

    # UTF-8 text is kept as the client wrote it (not as Latin-1 mojibake).
    key = "clé-€-1"
    headers = {"Idempotency-Key": key.encode()}
    first = await server.request("POST", "/runs", json=submission(), headers=headers)
    again = await server.request("POST", "/runs", json=submission(), headers=headers)
    assert first.status_code == again.status_code == 202, (first.text, again.text)
    assert again.headers["idempotent-replayed"] == "true"
    run = await server.request("GET", f"/runs/{first.json()['run_id']}")
    assert run.json()["idempotency_key"] == key


async def test_priority_is_bounded_for_non_admin_callers(serve_factory: ServeFactory) -> None:
    config = jwt_config()
    config["http"]["user_priority_range"] = [0, 100]
    server = await serve_factory(config, env=server_env({"RUNQ_TEST_JWT_SECRET": JWT_SECRET}))
    user = bearer(mint("alice"))
    admin = bearer(mint("root", scope=ADMIN_SCOPE))
    for priority in (-1, -1_000_000, 101):
        response = await server.request(
            "POST", "/runs", json=submission(priority=priority), headers=user
        )
        detail = assert_error(response, 400, "bad_request")["detail"]
        assert "user_priority_range" in detail, detail
    assert await stored_runs(server, admin) == 0

    runs = [
        await submit(server, delay_seconds=3600, headers=user, **fields)
        for fields in ({}, {"priority": 0}, {"priority": 100}, {"priority": None})
    ]
    boss = await submit(server, delay_seconds=3600, priority=-1_000_000, headers=admin)
    priorities = []
    for accepted in [*runs, boss]:
        job = await server.request("GET", f"/queue/jobs/{accepted['run_id']}", headers=admin)
        priorities.append(job.json()["priority"])
    assert priorities == [0, 0, 100, 0, -1_000_000]
