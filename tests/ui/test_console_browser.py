"""The operator console in a real Chromium against a real ``runq serve``, on both engines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import wait_for
from playwright.async_api import Page, expect
from serve_harness import (  # fixtures are used by name
    RunqServer,
    RunqSetup,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)
from ui_support import (
    ADMIN_SCOPE,
    API_KEY,
    SETTLE,
    assert_accessible,
    chromium,
    mint,
    new_page,
    screenshot,
    sign_in,
    start_console,
    submit,
    wait_status,
)

from runq.model import NewRun

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]

FAR_FUTURE = 3600.0


async def open_run(page: Page, server: RunqServer, run_id: str) -> None:
    await page.goto(f"{server.url}/ui/runs/{run_id}")
    await expect(page.get_by_role("heading", level=1)).to_contain_text(run_id)


async def test_sign_in_and_every_page(
    serve_factory: ServeFactory, runq_engine: str, tmp_path: Path
) -> None:
    """Signs in with the key; a run submitted over HTTP shows in the table; every page
    passes the accessibility scan; screenshots for the docs."""
    server = await start_console(serve_factory)
    async with chromium() as browser:
        page = await new_page(browser)
        await page.goto(f"{server.url}/ui/queue")
        assert "/ui/signin" in page.url  # not signed in: sent to the form
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "signin", tmp_path)
        await sign_in(page, server, API_KEY, start="/ui/queue")
        assert page.url.endswith("/ui/queue")

        done = await submit(server, "task/echo", {"hello": "console"})
        await wait_status(server, done, "completed")
        queued = await submit(server, "task/echo", {"later": True}, delay_seconds=FAR_FUTURE)

        # No reload: the overview's live stream brings the exporter's next numbers.
        await expect(page.locator('[data-live-stat="count-completed"]')).to_have_text("1")
        await expect(page.locator('[data-live-stat="count-queued"]')).to_have_text("1")
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "overview", tmp_path)

        await (
            page.get_by_role("navigation", name="Console").get_by_role("link", name="Runs").click()
        )
        rows = page.locator("table.runs tbody tr[data-run-id]")
        await expect(rows).to_have_count(2)
        await expect(page.locator(f'tr[data-run-id="{queued}"]')).to_contain_text("queued")
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "runs", tmp_path)
        # The dark scheme is a second palette: scanned for contrast like the light one.
        await page.emulate_media(color_scheme="dark")
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "runs-dark", tmp_path)
        await page.emulate_media(color_scheme="light")

        await page.get_by_role("link", name=done).click()
        await expect(page.get_by_role("heading", level=1)).to_contain_text(done)
        await expect(page.get_by_label("Answer", exact=True)).to_contain_text('"hello": "console"')
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "run", tmp_path)

        await page.get_by_role("link", name="Workers").click()
        await expect(page.locator("table tbody tr")).to_have_count(1)
        await expect(page.locator("table tbody")).to_contain_text("live")
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "workers", tmp_path)

        # Keyboard: the skip link is the first stop and moves focus to the main content.
        await page.keyboard.press("Tab")
        await expect(page.get_by_role("link", name="Skip to main content")).to_be_focused()
        await page.keyboard.press("Enter")
        await expect(page.locator("main")).to_be_focused()


async def test_dead_letter_requeued_from_its_page(
    serve_factory: ServeFactory, runq_engine: str, tmp_path: Path
) -> None:
    server = await start_console(serve_factory)
    run_id = await submit(server, "task/fail_first")
    await wait_status(server, run_id, "failed")
    async with chromium() as browser:
        page = await new_page(browser)
        await sign_in(page, server, API_KEY)
        await open_run(page, server, run_id)
        await expect(page.locator(".error-text")).to_contain_text("first attempt always fails")
        # Just failed: within the lock grace, a plain requeue is refused (409) ...
        await page.get_by_role("button", name="Requeue").click()
        await expect(page.get_by_role("alert")).to_contain_text("lock_grace")
        await assert_accessible(page)
        # ... and forced, it is requeued and completes on its second attempt.
        await page.get_by_role("checkbox", name=re.compile("^force")).check()
        await page.get_by_role("button", name="Requeue").click()
        await expect(page.get_by_role("status")).to_contain_text("requeued")
        await wait_status(server, run_id, "completed")
        await page.reload()
        await expect(page.locator("h1 .badge")).to_have_text("completed")
        await expect(page.get_by_label("Answer", exact=True)).to_contain_text('"attempt": 2')


async def test_paused_run_continued_with_a_typed_decision(
    serve_factory: ServeFactory, runq_engine: str, tmp_path: Path
) -> None:
    server = await start_console(serve_factory)
    run_id = await submit(server, "task/approve", {"amount": 10})
    await wait_status(server, run_id, "paused")
    async with chromium() as browser:
        page = await new_page(browser)
        await sign_in(page, server, API_KEY)
        await open_run(page, server, run_id)
        editor = page.get_by_label("Decision (JSON; empty for none)")
        await editor.fill('{"approved": tru')  # a typo is refused, the text kept
        await page.get_by_role("button", name="Continue").click()
        await expect(page.get_by_role("alert")).to_contain_text("not valid JSON")
        await expect(editor).to_have_value('{"approved": tru')
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "run-paused", tmp_path)
        await editor.fill('{"approved": true, "by": "night operator"}')
        await page.get_by_role("button", name="Continue").click()
        await expect(page.get_by_role("status")).to_contain_text("continued")
        body = await wait_status(server, run_id, "completed")
        assert body["answer"]["decision"] == {"approved": True, "by": "night operator"}


async def test_cancel_a_running_run(serve_factory: ServeFactory, runq_engine: str) -> None:
    server = await start_console(serve_factory)
    run_id = await submit(server, "task/sleep", {"seconds": 120})
    await wait_status(server, run_id, "running")
    async with chromium() as browser:
        page = await new_page(browser)
        await sign_in(page, server, API_KEY)
        await open_run(page, server, run_id)
        await page.get_by_role("button", name="Cancel run").click()
        await expect(page.get_by_role("status")).to_contain_text(
            re.compile("cancel", re.IGNORECASE)
        )
        await wait_status(server, run_id, "cancelled")


async def test_filters_paging_and_bulk_requeue(
    serve_factory: ServeFactory, runq_setup: RunqSetup, runq_engine: str, tmp_path: Path
) -> None:
    """5,000 queued runs and 100 dead letters: filter, page, select all, requeue them."""
    server = await start_console(serve_factory)
    async with runq_setup.queue() as queue:
        await queue.store.submit_many(
            [
                NewRun(component_type="task", component_id="echo", delay_seconds=FAR_FUTURE)
                for _ in range(5000)
            ]
        )
        dead = [NewRun(component_type="task", component_id="fail_first") for _ in range(100)]
        dead_ids = await queue.store.submit_many(dead)
    await wait_for(
        lambda: _count(server, "failed", 100), timeout=SETTLE * 3, message="100 dead letters"
    )
    async with chromium() as browser:
        page = await new_page(browser)
        await sign_in(page, server, API_KEY)
        await page.goto(f"{server.url}/ui/queue/jobs")
        await expect(page.get_by_role("status")).to_contain_text("5100 runs, page 1 of 102")
        await page.get_by_role("link", name="Last").click()
        await expect(page.get_by_role("status")).to_contain_text("page 102 of 102")
        await expect(page.locator("tr[data-run-id]")).to_have_count(50)
        await page.get_by_role("link", name="Previous").click()
        await expect(page.get_by_role("status")).to_contain_text("page 101 of 102")

        # Filter through the form (htmx swaps the results in place and updates the URL).
        await page.get_by_role("checkbox", name="failed", exact=True).check()
        await page.get_by_label("Per page").select_option("100")
        await page.get_by_role("button", name="Apply filters").click()
        await expect(page.get_by_role("status")).to_contain_text("100 runs, page 1 of 1")
        assert "status=failed" in page.url
        await expect(page.locator("tr[data-run-id] .badge")).to_have_text(["failed"] * 100)
        await assert_accessible(page)

        await page.get_by_label("Select every run on this page").check()
        await page.get_by_role("checkbox", name=re.compile("^force")).check()
        await page.get_by_role("button", name="Requeue", exact=True).click()
        await expect(page.get_by_role("status")).to_contain_text("100 of 100 runs requeued")
        await assert_accessible(page)
    await wait_for(
        lambda: _count(server, "completed", 100), timeout=SETTLE * 3, message="100 requeued done"
    )
    assert len(dead_ids) == 100


async def _count(server: RunqServer, status: str, expected: int) -> bool:
    response = await server.request(
        "GET", "/queue/stats", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    counts: dict[str, int] = response.json()["counts"]
    return counts.get(status, 0) == expected


async def test_user_without_admin_scope(
    serve_factory: ServeFactory, runq_engine: str, tmp_path: Path
) -> None:
    server = await start_console(serve_factory, auth="jwt")
    alice, bob = mint("alice"), mint("bob")
    mine = await submit(server, "task/echo", {"who": "alice"}, credential=alice)
    theirs = await submit(server, "task/echo", {"who": "bob"}, credential=bob)
    await wait_status(server, mine, "completed", credential=alice)
    async with chromium() as browser:
        page = await new_page(browser)
        await sign_in(page, server, alice)
        assert page.url.endswith("/ui/runs")
        await expect(page.locator("tr[data-run-id]")).to_have_count(1)
        await expect(page.locator(f'tr[data-run-id="{mine}"]')).to_be_visible()
        await assert_accessible(page)

        response = await page.goto(f"{server.url}/ui/queue")
        assert response is not None
        assert response.status == 403
        await expect(page.get_by_role("heading", level=1)).to_have_text("Not allowed")
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "forbidden", tmp_path)

        response = await page.goto(f"{server.url}/ui/runs/{theirs}")
        assert response is not None
        assert response.status == 404  # another user's run does not exist for alice

    # An admin token sees both.
    async with chromium() as browser:
        page = await new_page(browser)
        await sign_in(page, server, mint("root", ADMIN_SCOPE))
        await page.goto(f"{server.url}/ui/queue/jobs")
        await expect(page.locator("tr[data-run-id]")).to_have_count(2)
