"""The operator console in a real Chromium against a real ``runq serve``, on both engines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.async_api import Page, expect
from serve_harness import (  # fixtures are used by name
    RunqServer,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)
from ui_support import (
    ADMIN_SCOPE,
    API_KEY,
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
    asked = 'Refund 120 EUR to order 42? Approve with {"approved": true}.'
    run_id = await submit(server, "task/ui_ask", {"amount": 120, "summary": asked})
    await wait_status(server, run_id, "paused")
    async with chromium() as browser:
        page = await new_page(browser)
        await sign_in(page, server, API_KEY)
        await open_run(page, server, run_id)
        editor = page.get_by_label("Decision (JSON; empty for none)")
        # The handler's question, next to the editor (tests/ui/test_console_http.py checks
        # that markup in it stays text).
        question = page.get_by_role("group", name="Continue").locator("#pause-summary")
        await expect(question).to_have_text(asked)
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
