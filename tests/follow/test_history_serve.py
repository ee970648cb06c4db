"""History for every user: ``GET /runs`` over real ``runq serve`` processes, both engines.

Who sees what (admin, approver, the owner, another user, a service account's runs), the
filters, keyset paging that stays exact while runs are inserted, the run body's usage and
pause fields, and whether a continued run keeps its answer.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import jwt
import pytest
from helpers import wait_for
from serve_harness import (  # fixtures are used by name
    RunqSetup,
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

SECRET = "history-jwt-secret-0123456789abcdef-0123456789abcdef-0123456789abcdef"
AUDIENCE = "runq-api"
ISSUER = "https://issuer.test"
FAR_FUTURE = 3600.0
SUMMARY = "Refund 120 EUR to order 42?"


def _token(sub: str, scope: str = "", *, service_account: bool = False) -> dict[str, str]:
    claims: dict[str, Any] = {"sub": sub, "exp": int(time.time()) + 600}
    claims |= {"aud": AUDIENCE, "iss": ISSUER}
    if scope:
        claims["scope"] = scope
    if service_account:
        claims["service_account"] = True
    return {"Authorization": "Bearer " + jwt.encode(claims, SECRET, algorithm="HS256")}


ALICE, BOB = _token("alice"), _token("bob")
ADMIN, APPROVER = _token("root", "runq:admin"), _token("carol", "runq:approve")
#: A machine client whose subject is "alice": its runs are not alice's to see, nor its own
#: (only admins and approvers see a service account's runs; ``Identity.owns``).
ROBOT = _token("alice", service_account=True)


def _config(engine: str, *, keep_answer: bool = False) -> dict[str, Any]:
    return {
        "queue": {"poll_interval": 0.1},
        "routing": {"*": "postgres" if engine == "postgres" else "local"},
        "components": {
            "task/hist_ask": "follow.history_handlers:ask",
            "task/hist_done": "follow.history_handlers:done",
        },
        "privacy": {"level": "full", "keep_answer_after_approval": keep_answer},
        "http": {
            "auth": "jwt",
            "jwt": {
                "secret": "env:RUNQ_TEST_HISTORY_JWT",
                "audience": AUDIENCE,
                "issuer": ISSUER,
                "leeway_seconds": 0,
            },
        },
    }


async def _start(serve_factory: ServeFactory, setup: RunqSetup, **options: Any) -> str:
    server = await serve_factory(
        _config(setup.engine, **options), env={"RUNQ_TEST_HISTORY_JWT": SECRET}
    )
    return server.url


async def _submit(
    client: httpx.AsyncClient, who: dict[str, str], component: str, payload: Any, **fields: Any
) -> str:
    ctype, _, cid = component.partition("/")
    body = {"component_type": ctype, "component_id": cid, "payload": payload, **fields}
    response = await client.post("/runs", json=body, headers=who)
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    return run_id


async def _settled(client: httpx.AsyncClient, run_id: str, status: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        response = await client.get(f"/runs/{run_id}", params={"wait": 5}, headers=ADMIN)
        body: dict[str, Any] = response.json()
        return body if body["status"] == status else None

    found: dict[str, Any] = await wait_for(check, timeout=30, message=f"{run_id} {status}")
    return found


async def _listed(
    client: httpx.AsyncClient, who: dict[str, str], **params: Any
) -> list[dict[str, Any]]:
    """Every page of ``GET /runs`` with ``params``, following ``next_cursor``."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = await client.get("/runs", params=query, headers=who)
        assert response.status_code == 200, response.text
        page = response.json()
        items += page["data"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items


def _ids(items: list[dict[str, Any]]) -> list[str]:
    return [item["id"] for item in items]


async def test_history_visibility_filters_and_pause_summary(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    url = await _start(serve_factory, runq_setup)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        mine = await _submit(client, ALICE, "task/hist_done", {"n": 1}, session_id="s1")
        asked = await _submit(
            client, ALICE, "task/hist_ask", {"summary": "\x1b[31m" + SUMMARY + "\n", "secret": 7}
        )
        bobs = await _submit(client, BOB, "task/hist_done", {"n": 2})
        robots = await _submit(client, ROBOT, "task/hist_done", {"n": 3})
        done = await _settled(client, mine, "completed")
        paused = await _settled(client, asked, "paused")
        for run_id in (bobs, robots):
            await _settled(client, run_id, "completed")
        every = [robots, bobs, asked, mine]  # newest first

        # -- who lists what
        assert _ids(await _listed(client, ADMIN)) == every
        assert _ids(await _listed(client, APPROVER)) == every
        assert _ids(await _listed(client, ALICE)) == [asked, mine]
        assert _ids(await _listed(client, BOB)) == [bobs]
        # The listing follows Identity.owns: a service account owns no runs, neither the
        # one it submitted nor those of the person whose id its subject happens to be.
        assert _ids(await _listed(client, ROBOT)) == []
        assert (await client.get("/runs")).status_code == 401

        # -- content: admins and owners, never a mere approver
        by_admin = {i["id"]: i for i in await _listed(client, ADMIN)}
        assert by_admin[bobs]["payload"] == {"n": 2}
        assert by_admin[bobs]["answer"] == {"echo": {"n": 2}}
        for item in await _listed(client, APPROVER):
            assert "payload" not in item
            assert "answer" not in item
        assert {i["id"]: i["payload"] for i in await _listed(client, ALICE)}[mine] == {"n": 1}

        # -- opening one run, its events and ?wait follow the same rule
        visible = {
            "admin": (ADMIN, set(every)),
            "approver": (APPROVER, set(every)),
            "alice": (ALICE, {asked, mine}),
            "bob": (BOB, {bobs}),
            "robot": (ROBOT, set()),
        }
        for name, (who, sees) in visible.items():
            for run_id in every:
                expected = 200 if run_id in sees else 404
                for path in (f"/runs/{run_id}", f"/runs/{run_id}/events?stream=false"):
                    got = await client.get(path, headers=who)
                    assert got.status_code == expected, (name, path, got.text)
                waited = await client.get(f"/runs/{run_id}", params={"wait": 1}, headers=who)
                assert waited.status_code == expected, (name, run_id)

        # -- the run body: usage, start time, the pause's question
        assert (done["tokens"], done["cost"]) == (7, 0.25)
        assert done["started_at"] is not None
        assert done["pause"] is None
        assert paused["pause"] == {"reason": "approval", "summary": "[31m" + SUMMARY}
        seen = (await client.get(f"/runs/{asked}", headers=APPROVER)).json()
        assert seen["pause"]["summary"] == "[31m" + SUMMARY
        assert "payload" not in seen
        listed = {i["id"]: i for i in await _listed(client, APPROVER)}[asked]
        assert listed["pause"]["summary"] == "[31m" + SUMMARY

        # -- filters
        async def ids(who: dict[str, str], **params: Any) -> list[str]:
            return _ids(await _listed(client, who, **params))

        assert await ids(ADMIN, status="paused") == [asked]
        assert await ids(ADMIN, status=["paused", "completed"]) == every
        assert await ids(ADMIN, component="task/hist_ask") == [asked]
        assert await ids(ADMIN, component="task/hist_d*") == [robots, bobs, mine]
        assert await ids(ADMIN, component="task/*") == every
        assert await ids(ADMIN, component="agent/*") == []
        assert await ids(ALICE, session_id="s1") == [mine]
        assert await ids(BOB, session_id="s1") == []
        at = {i["id"]: i["created_at"] for i in await _listed(client, ADMIN)}
        window = {"created_after": at[asked], "created_before": at[robots]}
        # Inclusive after, exclusive before (the clock has millisecond steps, so the
        # expectation is read from the times rather than assumed distinct).
        inside = [i for i in every if at[asked] <= at[i] < at[robots]]
        assert await ids(ADMIN, **window) == inside
        assert robots not in inside
        iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at[mine] - 60))
        assert await ids(ALICE, created_after=iso) == [asked, mine]
        assert await ids(ADMIN, limit=1) == every  # one page per run, cursors between

        # -- bad input: 400 with a reason
        bad = {
            "cursor": "not-a-cursor",
            "limit": 0,
            "component": "no pattern",
            "created_after": "yesterday",
            "status": "lost",
        }
        for name, value in bad.items():
            response = await client.get("/runs", params={name: value}, headers=ADMIN)
            assert response.status_code == 400, (name, response.text)
            assert response.json()["detail"], name
        assert (await client.get("/runs?limit=1001", headers=ADMIN)).status_code == 400

        # -- continued after approval: no answer kept by default
        decided = await client.post(
            f"/runs/{asked}/continue", json={"decision": "yes"}, headers=APPROVER
        )
        assert decided.status_code == 200, decided.text
        finished = await _settled(client, asked, "completed")
        assert finished["answer"] is None
        assert finished["pause"] is None
        assert (await client.get(f"/runs/{asked}", headers=ALICE)).json()["answer"] is None


async def test_keep_answer_after_approval(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    url = await _start(serve_factory, runq_setup, keep_answer=True)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        asked = await _submit(client, ALICE, "task/hist_ask", {"summary": SUMMARY, "secret": 7})
        await _settled(client, asked, "paused")
        decided = await client.post(
            f"/runs/{asked}/continue", json={"decision": "yes"}, headers=APPROVER
        )
        assert decided.status_code == 200, decided.text
        await _settled(client, asked, "completed")
        mine = (await client.get(f"/runs/{asked}", headers=ALICE)).json()
        assert mine["answer"] == {"decision": "yes", "secret": 7}


async def test_paging_is_exact_while_runs_are_inserted(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    url = await _start(serve_factory, runq_setup)
    seeded: list[str] = []
    components = _config(runq_setup.engine)["components"]
    async with runq_setup.queue({"components": components}) as q:
        for batch in range(6):
            # A batch shares one created_at: pages must break ties by id.
            news = [
                q.new_run("task", "hist_done", {"b": batch}, delay_seconds=FAR_FUTURE)
                for _ in range(500)
            ]
            seeded += await q.store.submit_many(news)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            seen: list[tuple[float, str]] = []
            cursor: str | None = None
            pages = 0
            while True:
                params: dict[str, Any] = {"limit": 137}
                if cursor:
                    params["cursor"] = cursor
                response = await client.get("/runs", params=params, headers=ADMIN)
                assert response.status_code == 200, response.text
                page = response.json()
                seen += [(item["created_at"], item["id"]) for item in page["data"]]
                cursor, pages = page["next_cursor"], pages + 1
                if cursor is None:
                    break
                # Newer runs arrive between pages, over HTTP and in bulk.
                await _submit(client, ALICE, "task/hist_done", {}, delay_seconds=FAR_FUTURE)
                more = [
                    q.new_run("task", "hist_done", {}, delay_seconds=FAR_FUTURE) for _ in range(3)
                ]
                await q.store.submit_many(more)

            ids = [run_id for _, run_id in seen]
            assert len(ids) == len(set(ids)), "a run was listed twice"
            assert set(ids) == set(seeded), "a run was skipped, or a newer one slipped in"
            assert seen == sorted(seen, reverse=True), "not newest first"
            assert pages == -(-len(seeded) // 137)

            # The operator listing pages the same way, and refuses a cursor it cannot follow.
            first = await client.get("/queue/jobs", params={"limit": 50}, headers=ADMIN)
            jobs = first.json()
            nxt = await client.get(
                "/queue/jobs", params={"limit": 50, "cursor": jobs["next_cursor"]}, headers=ADMIN
            )
            assert nxt.status_code == 200, nxt.text
            listed = [j["id"] for j in jobs["data"] + nxt.json()["data"]]
            assert len(set(listed)) == 100  # no overlap between the two pages
            by_priority = await client.get(
                "/queue/jobs",
                params={"cursor": jobs["next_cursor"], "sort_by": "priority"},
                headers=ADMIN,
            )
            assert by_priority.status_code == 400
            assert "sort_by=created_at" in by_priority.json()["detail"]
            filtered = await client.get(
                "/queue/jobs",
                params={"user_id": "alice", "component": "task/hist_done", "limit": 1000},
                headers=ADMIN,
            )
            assert filtered.json()["meta"]["total_count"] == pages - 1
