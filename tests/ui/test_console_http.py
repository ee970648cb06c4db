"""The console's and the bulk verbs' rules over plain HTTP, against a real ``runq serve``:
cookies, CSRF, origins, loopback-only open mode, hostile parameters, per-id outcomes."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from markupsafe import escape
from serve_harness import (  # fixtures are used by name
    RunqServer,
    RunqSetup,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)
from ui_handlers import ASK_SUMMARY
from ui_support import (
    API_KEY,
    bearer,
    client_for,
    mint,
    server_env,
    start_console,
    submit,
    wait_status,
)

from runq.listing import RunCursor
from runq.model import clean_pause_summary

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]

FAR_FUTURE = 3600.0
_HIDDEN = re.compile(r'name="(csrf|signin_token)" value="([^"]+)"')


def hidden_field(html: str, name: str) -> str:
    for found, value in _HIDDEN.findall(html):
        if found == name:
            return str(value)
    raise AssertionError(f"no hidden {name} field in the page")


@asynccontextmanager
async def signed_in(
    server: RunqServer, credential: str = API_KEY
) -> AsyncIterator[httpx.AsyncClient]:
    """A client holding a session cookie, got through the sign-in form."""
    async with client_for(server) as client:
        form = await client.get("/ui/signin")
        assert form.status_code == 200
        token = hidden_field(form.text, "signin_token")
        response = await client.post(
            "/ui/signin", data={"signin_token": token, "credential": credential, "next": "/ui"}
        )
        assert response.status_code == 303, response.text
        yield client


async def test_sign_in_sets_a_strict_http_only_cookie(
    serve_factory: ServeFactory, runq_engine: str
) -> None:
    server = await start_console(serve_factory)
    async with client_for(server) as client:
        form = await client.get("/ui/signin")
        token = hidden_field(form.text, "signin_token")
        wrong = await client.post(
            "/ui/signin", data={"signin_token": token, "credential": "not-the-key"}
        )
        assert wrong.status_code == 401
        assert "runq_session" not in wrong.headers.get("set-cookie", "")

        # Without the sign-in form's token (a login CSRF): refused.
        forged = await client_for(server).post("/ui/signin", data={"credential": API_KEY})
        assert forged.status_code == 403

        token = hidden_field(wrong.text, "signin_token")
        response = await client.post(
            "/ui/signin",
            data={"signin_token": token, "credential": API_KEY, "next": "//evil.example/x"},
        )
        assert response.status_code == 303
        assert response.headers["location"] == "/ui"  # never off-site
        cookie = next(
            c for c in response.headers.get_list("set-cookie") if c.startswith("runq_session=")
        )
        flags = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/ui"} <= flags
        assert "secure" not in flags  # plain HTTP here; behind TLS it would be set
        page = await client.get("/ui/queue")
        assert page.status_code == 200
        for header in ("content-security-policy", "x-frame-options"):
            assert header in page.headers


async def test_forged_forms_are_refused(serve_factory: ServeFactory, runq_engine: str) -> None:
    server = await start_console(serve_factory)
    run_id = await submit(server, "task/echo", delay_seconds=FAR_FUTURE)
    async with signed_in(server) as client:
        page = await client.get(f"/ui/runs/{run_id}")
        csrf = hidden_field(page.text, "csrf")
        cancel = f"/ui/runs/{run_id}/cancel"

        assert (await client.post(cancel, data={})).status_code == 403
        assert (await client.post(cancel, data={"csrf": "0" * 64})).status_code == 403
        other_site = await client.post(
            cancel, data={"csrf": csrf}, headers={"Origin": "https://evil.example"}
        )
        assert other_site.status_code == 403
        bulk = await client.post("/ui/queue/jobs/bulk", data={"ids": run_id, "action": "cancel"})
        assert bulk.status_code == 403
        assert (await wait_status(server, run_id, "queued"))["status"] == "queued"

        same_site = await client.post(cancel, data={"csrf": csrf}, headers={"Origin": server.url})
        assert same_site.status_code == 303
        await wait_status(server, run_id, "cancelled")

        # Signing out needs the token too, then the session is gone.
        assert (await client.post("/ui/signout", data={})).status_code == 403
        out = await client.post("/ui/signout", data={"csrf": csrf})
        assert out.status_code == 303
        client.cookies.clear()
        again = await client.get("/ui/queue")
        assert again.status_code == 303
        assert again.headers["location"].startswith("/ui/signin")


async def test_hostile_parameters_get_a_clear_400(
    serve_factory: ServeFactory, runq_engine: str
) -> None:
    server = await start_console(serve_factory)
    async with signed_in(server) as client:
        for query in (
            "status=bogus",
            "page=0",
            "page=abc",
            "page=99999999999999",
            "limit=100000",
            "sort=created_at;drop table runs",
            "order=sideways",
            "user=%00",
            "status=queued&page=1&page=2",
            "component=echo",
            "session=%01",
            "deployment=" + "x" * 201,
            "created_after=yesterday",
            "created_before=1e400",
            "cursor=not-one-of-ours",
            "sort=priority&cursor=" + RunCursor(1.0, "a").encode(),
        ):
            response = await client.get(f"/ui/queue/jobs?{query}")
            assert response.status_code == 400, (query, response.status_code)
            assert "text/html" in response.headers["content-type"]
            reason = r'class="problem" role="alert"><strong>400</strong>: \w'
            assert re.search(reason, response.text), response.text
        assert (await client.get("/ui/runs/%00")).status_code == 404
        assert (await client.get(f"/ui/runs/{'x' * 5000}")).status_code == 404
        filtered = await client.get("/ui/queue/jobs?component=task/echo&session=s")
        assert filtered.status_code == 200
        assert 'value="task/echo"' in filtered.text  # applied, and shown in the form


async def test_open_mode_answers_loopback_names_only(
    serve_factory: ServeFactory, runq_engine: str
) -> None:
    server = await start_console(serve_factory, auth="open")
    async with client_for(server) as client:
        assert (await client.get("/ui/queue")).status_code == 200
        rebound = await client.get("/ui/queue", headers={"Host": "evil.example"})
        # The API's edge check answers first (a rebound name is a misdirected request).
        assert rebound.status_code == 421
        assert (await client.get("/ui/signin")).status_code == 303  # nothing to sign in to


async def test_bulk_verbs_answer_per_id(serve_factory: ServeFactory, runq_engine: str) -> None:
    server = await start_console(serve_factory)
    failed = await submit(server, "task/fail_first")
    done = await submit(server, "task/echo")
    queued = await submit(server, "task/echo", delay_seconds=FAR_FUTURE)
    await wait_status(server, failed, "failed")
    await wait_status(server, done, "completed")

    body = {"ids": [failed, done, "no-such-id", failed], "force": True}
    response = await server.request("POST", "/queue/jobs/requeue", json=body, headers=bearer())
    assert response.status_code == 200, response.text
    result = response.json()
    assert [(r["id"], r["outcome"]) for r in result["results"]] == [
        (failed, "requeued"),
        (done, "invalid_transition"),
        ("no-such-id", "not_found"),
    ]
    assert (result["succeeded"], result["failed"]) == (1, 2)
    await wait_status(server, failed, "completed")

    response = await server.request(
        "POST", "/queue/jobs/cancel", json={"ids": [queued, done]}, headers=bearer()
    )
    assert response.status_code == 200, response.text
    outcomes = [(r["outcome"], r["status"]) for r in response.json()["results"]]
    assert outcomes == [("cancelled", "cancelled"), ("conflict", None)]

    for bad in ({"ids": []}, {"ids": ["a"] * 1001}, {"ids": [1]}, {"id": [queued]}):
        refused = await server.request("POST", "/queue/jobs/cancel", json=bad, headers=bearer())
        assert refused.status_code == 400, (bad, refused.text)
    unauthenticated = await server.request("POST", "/queue/jobs/cancel", json={"ids": [queued]})
    assert unauthenticated.status_code == 401


async def test_bulk_verbs_take_a_filter_instead_of_ids(
    serve_factory: ServeFactory, runq_engine: str
) -> None:
    """The dead letters of one cause, by filter: the matching jobs only, each answered."""
    server = await start_console(serve_factory)
    dead = [await submit(server, "task/fail_first", session_id="outage") for _ in range(3)]
    other = await submit(server, "task/fail_first", session_id="elsewhere")
    for run_id in [*dead, other]:
        await wait_status(server, run_id, "failed")
    waiting = [await submit(server, "task/echo", delay_seconds=FAR_FUTURE) for _ in range(2)]

    body = {"filter": {"status": ["failed"], "session_id": "outage"}, "force": True}
    response = await server.request("POST", "/queue/jobs/requeue", json=body, headers=bearer())
    assert response.status_code == 200, response.text
    result = response.json()
    assert sorted(r["id"] for r in result["results"]) == sorted(dead)
    assert (result["succeeded"], result["failed"], result["matched"]) == (3, 0, 3)
    for run_id in dead:
        await wait_status(server, run_id, "completed")
    await wait_status(server, other, "failed")  # outside the filter: untouched

    cancel = {"filter": {"status": ["queued"], "component": "task/echo"}}
    response = await server.request("POST", "/queue/jobs/cancel", json=cancel, headers=bearer())
    assert response.status_code == 200, response.text
    assert sorted(r["id"] for r in response.json()["results"]) == sorted(waiting)

    for bad in (
        {},  # neither
        {"ids": [other], "filter": {}},  # both
        {"filter": {"status": ["sleeping"]}},
        {"filter": {"component": "no-slash"}},
        {"filter": {"created_after": "yesterday"}},
        {"filter": {"colour": "red"}},
    ):
        refused = await server.request("POST", "/queue/jobs/cancel", json=bad, headers=bearer())
        assert refused.status_code == 400, (bad, refused.text)


async def test_bulk_verbs_need_the_admin_scope(
    serve_factory: ServeFactory, runq_engine: str
) -> None:
    server = await serve_factory(
        {
            "http": {"auth": "jwt", "jwt": {"secret": "env:RUNQ_TEST_UI_JWT_SECRET"}},
            "routing": {"*": "local"},
        },
        env=server_env(),
    )
    alice = mint("alice")
    mine = await submit(server, "task/echo", delay_seconds=FAR_FUTURE, credential=alice)
    response = await server.request(
        "POST", "/queue/jobs/cancel", json={"ids": [mine]}, headers=bearer(alice)
    )
    assert response.status_code == 403
    await wait_status(server, mine, "queued", credential=alice)


async def test_a_pause_summary_is_shown_to_approvers_and_by_the_cli(
    serve_factory: ServeFactory, runq_setup: RunqSetup, runq_engine: str
) -> None:
    """The handler's question, next to the continue editor, for the run's user and for an
    approver (who may not read the payload); escaped as text, in the browser and in
    ``runq jobs show``."""
    server = await start_console(serve_factory, auth="jwt")
    alice = mint("alice")
    run_id = await submit(server, "task/ui_ask", {"order": 42}, credential=alice)
    await wait_status(server, run_id, "paused", credential=alice)
    summary = clean_pause_summary(ASK_SUMMARY)
    assert summary is not None
    assert "\x1b" not in summary  # stored without the escape; markup kept as text

    for who in (alice, mint("carol", "runq:approve")):
        async with signed_in(server, who) as client:
            page = await client.get(f"/ui/runs/{run_id}")
            assert page.status_code == 200, page.text
            assert f'<blockquote id="pause-summary">{escape(summary)}</blockquote>' in (page.text)
            assert "<b>120 EUR</b>" not in page.text
            assert 'aria-describedby="pause-summary decision-help"' in page.text
    async with signed_in(server, mint("bob")) as client:
        assert (await client.get(f"/ui/runs/{run_id}")).status_code == 404

    shown = await runq_setup.cli("jobs", "show", run_id, config=server.config_path)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout
    line = next(line for line in shown.stdout.splitlines() if "pause_summary" in line)
    assert "[bold]yes[/]" in line  # rich markup printed literally, not interpreted
    as_json = await runq_setup.cli("jobs", "show", run_id, "--json", config=server.config_path)
    assert json.loads(as_json.stdout)["pause_summary"] == summary
