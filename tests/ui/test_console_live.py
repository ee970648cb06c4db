"""The console's live, schedules and limits pages in a real Chromium against a real ``runq
serve``, on both engines: rows and a timeline that fill without a reload, the chart, the
schedules page's pause and resume, and the limits page's use and pauses."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for
from playwright.async_api import Locator, Page, expect
from serve_harness import (  # fixtures are used by name
    RunqServer,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)
from ui_support import (
    API_KEY,
    SETTLE,
    assert_accessible,
    bearer,
    chromium,
    console_config,
    new_page,
    screenshot,
    server_env,
    sign_in,
    submit,
    wait_status,
)

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]

#: A schedule that fires every two seconds, so a test sees a fire without waiting a minute.
FAST_SCHEDULE = {
    "name": "every-two-seconds",
    "cron": "*/2 * * * * *",
    "component": "task/echo",
    "payload": {"from": "schedule"},
    "overlap": "skip",
}
LIMITS = {"task/sleep": {"max_running": 1, "rate": "100/minute"}}


async def start(serve_factory: ServeFactory, **extra: Any) -> RunqServer:
    config = console_config()
    config.update(extra)
    return await serve_factory(config, env=server_env())


async def test_a_submitted_run_appears_and_its_timeline_fills_live(
    serve_factory: ServeFactory, runq_engine: str, tmp_path: Path
) -> None:
    server = await start(serve_factory)
    async with chromium() as browser:
        page = await new_page(browser)
        streams: list[str] = []
        page.on("request", lambda r: streams.append(r.url) if "/live" in r.url else None)
        await sign_in(page, server, API_KEY, start="/ui/queue/jobs")
        await expect(page.locator("#run-count")).to_contain_text("0 runs")

        # Submitted over HTTP while the page is open: the row arrives without a reload.
        run_id = await submit(server, "task/sleep", {"seconds": 1.5})
        row = page.locator(f'tr[data-run-id="{run_id}"]')
        await expect(row).to_be_visible()
        await expect(row).to_contain_text("completed")
        await expect(page.locator("#run-count")).to_contain_text("1 run")
        assert len(streams) == 1, f"one stream for the page, not a poll per change: {streams}"

        # The run page of a run still running: its timeline grows as the run goes on.
        slow = await submit(server, "task/sleep", {"seconds": 2})
        await wait_status(server, slow, "running")
        await page.goto(f"{server.url}/ui/runs/{slow}")
        timeline = page.locator("#timeline li")
        await expect(page.locator("#timeline")).to_contain_text("claimed")
        before = await timeline.count()
        await expect(page.locator("#timeline")).to_contain_text("completed")
        assert await timeline.count() > before, "the final event came by the stream"
        await expect(page.locator("#run-status")).to_have_text("completed")
        await expect(page.locator("#run-live-note")).to_contain_text("now completed")
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "run-timeline", tmp_path)


async def test_the_chart_shows_the_last_hour(
    serve_factory: ServeFactory, runq_engine: str, tmp_path: Path
) -> None:
    server = await start(serve_factory)
    done = [await submit(server, "task/echo", {"n": i}) for i in range(3)]
    failed = await submit(server, "task/fail_first")
    for run_id in done:
        await wait_status(server, run_id, "completed")
    await wait_status(server, failed, "failed")
    async with chromium() as browser:
        page = await new_page(browser)
        await sign_in(page, server, API_KEY, start="/ui/queue")
        chart = page.get_by_role("img", name=re.compile("Runs completed and failed per minute"))
        # The counts are cached for a few seconds; the live stream redraws the chart.
        await expect(page.locator("[data-chart-total]")).to_contain_text(
            "3 completed, 1 failed in the last hour"
        )
        await expect(chart).to_be_visible()
        await expect(page.locator("#throughput-desc")).to_contain_text("3 completed and 1 failed")
        await expect(page.locator("#throughput rect.bar-completed")).not_to_have_count(0)
        await expect(page.locator("#throughput rect.bar-failed")).not_to_have_count(0)
        await page.get_by_text("The chart's numbers as a table").click()
        table = page.locator("#throughput table")
        await expect(table.locator("tbody tr").first).to_be_visible()
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "chart", tmp_path)


async def test_a_schedule_is_paused_and_resumed(
    serve_factory: ServeFactory, runq_engine: str, tmp_path: Path
) -> None:
    server = await start(serve_factory, schedules=[FAST_SCHEDULE])
    async with chromium() as browser:
        page = await new_page(browser)
        await sign_in(page, server, API_KEY)
        await (
            page.get_by_role("navigation", name="Console")
            .get_by_role("link", name="Schedules")
            .click()
        )
        row = page.locator('tr[data-schedule="every-two-seconds"]')
        await expect(row).to_contain_text("active")
        # The page is not live: a fire shows on the next load, with a link to its run.
        await wait_for(
            lambda: reloaded_has(page, row.get_by_role("link")),
            timeout=SETTLE,
            interval=0.5,
            message="the schedule's first run is linked",
        )
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "schedules", tmp_path)

        await row.get_by_role("button", name="Pause schedule every-two-seconds").click()
        await expect(page.get_by_role("status")).to_contain_text("paused on every replica")
        await expect(row).to_contain_text("paused")
        listed = await server.request("GET", "/queue/schedules/", headers=bearer())
        assert listed.json()[0]["paused"] is True

        await row.get_by_role("button", name="Resume schedule every-two-seconds").click()
        await expect(page.get_by_role("status")).to_contain_text("resumed")
        await expect(row).to_contain_text("active")
        listed = await server.request("GET", "/queue/schedules/", headers=bearer())
        assert listed.json()[0]["paused"] is False


async def reloaded_has(page: Page, locator: Locator) -> bool:
    await page.reload()
    return await locator.count() > 0


async def test_the_limits_page_shows_use_and_removes_a_pause(
    serve_factory: ServeFactory, runq_engine: str, tmp_path: Path
) -> None:
    server = await start(serve_factory, limits=LIMITS)
    sleepers = [await submit(server, "task/sleep", {"seconds": 60}) for _ in range(3)]
    await wait_status(server, sleepers[0], "running")
    paused = await server.request(
        "POST",
        "/queue/pauses/",
        json={"component": "task/echo", "reason": "maintenance window"},
        headers=bearer(),
    )
    assert paused.status_code == 201, paused.text
    held = await submit(server, "task/echo", {"held": True})
    async with chromium() as browser:
        page = await new_page(browser)
        await sign_in(page, server, API_KEY)
        await (
            page.get_by_role("navigation", name="Console")
            .get_by_role("link", name="Limits")
            .click()
        )
        limit = page.locator('tr[data-limit="task/sleep"]')
        await expect(limit).to_contain_text("1 of 1")
        await expect(limit.locator("td").nth(3)).to_have_text("2")  # queued, due
        await expect(limit.locator("td").nth(4)).to_have_text("2")  # held back
        # 1 start in this minute's window, or 0 when a new minute began since the claim.
        await expect(limit).to_contain_text(re.compile(r"[01] of 100 per minute"))
        pause = page.locator("tr[data-pause]")
        await expect(pause).to_contain_text("maintenance window")
        await expect(pause.locator("td").nth(3)).to_have_text("1")
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "limits", tmp_path)

        await pause.get_by_role("button", name=re.compile("Remove the pause")).click()
        await expect(page.get_by_role("status")).to_contain_text("pause is removed")
        await expect(page.locator("tr[data-pause]")).to_have_count(0)
        await wait_status(server, held, "completed")
