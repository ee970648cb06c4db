"""The runs table's filters and cursor pages in a real Chromium against a real ``runq
serve``, on both engines, over 5,000 runs seeded through the store's bulk path.

Walking the pages forward shows every run exactly once, also while runs are submitted
mid-walk; each filter narrows to exactly the runs it names; a user without the admin
scope sees only their own runs whatever the URL asks; the live rows follow a filtered
later page; 100 dead letters are selected and requeued at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
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
    API_KEY,
    SETTLE,
    assert_accessible,
    bearer,
    chromium,
    mint,
    new_page,
    screenshot,
    sign_in,
    start_console,
    submit,
)

from runq.model import Actor, NewRun
from runq.queue import Queue

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]

FAR_FUTURE = 3600.0
SEEDED = 5000
COMPONENTS = ("echo", "sleep", "sleepless")
USERS = ("alice", "bob", "carol", "dave", None)


@dataclass(frozen=True)
class Seed:
    """One seeded run and the fields the filters look at."""

    id: str
    component: str
    session: str
    user: str | None
    deployment: str | None
    late: bool  # created at or after the boundary second


def _new(i: int) -> NewRun:
    return NewRun(
        component_type="task",
        component_id=COMPONENTS[i % 3],
        session_id=f"s-{i % 7}",
        actor=Actor(user_id=USERS[i % 5]),
        deployment_id="eu" if i % 4 == 0 else None,
        delay_seconds=FAR_FUTURE,  # never claimed: the table stays as seeded
    )


async def _newest_created_at(queue: Queue) -> float:
    return (await queue.store.list_jobs(limit=1)).data[0].created_at


async def seed_runs(queue: Queue) -> tuple[list[Seed], float]:
    """5,000 runs in two bulk inserts on either side of a whole second (the date-time
    input's step), and that second."""
    half = SEEDED // 2
    early = await queue.store.submit_many([_new(i) for i in range(half)])
    boundary = float(math.floor(await _newest_created_at(queue)) + 1)
    # The second batch is stamped by the database clock: wait until it passed the boundary.
    await wait_for(
        lambda: _clock_past(queue, boundary), timeout=5, message="the clock passes the boundary"
    )
    late = await queue.store.submit_many([_new(i) for i in range(half, SEEDED)])
    seeds = [
        Seed(
            id=run_id,
            component=f"task/{COMPONENTS[i % 3]}",
            session=f"s-{i % 7}",
            user=USERS[i % 5],
            deployment="eu" if i % 4 == 0 else None,
            late=i >= half,
        )
        for i, run_id in enumerate([*early, *late])
    ]
    return seeds, boundary


async def _clock_past(queue: Queue, at: float) -> bool:
    return await queue.store.now() > at


def _local(epoch: float) -> str:
    """The form's date-time value (UTC) of ``epoch``."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S")


async def shown_ids(page: Page) -> list[str]:
    ids: list[str] = await page.locator("tr[data-run-id]").evaluate_all(
        "rows => rows.map((row) => row.dataset.runId)"
    )
    return ids


async def walk_forward(
    page: Page, *, on_page: Callable[[int], Awaitable[None]] | None = None
) -> list[list[str]]:
    """The row ids of every page from the one shown to the last, following Next."""
    pages: list[list[str]] = []
    while True:
        await expect(page.locator("#run-count")).to_be_visible()
        pages.append(await shown_ids(page))
        if on_page is not None:
            await on_page(len(pages))
        following = page.get_by_role("link", name="Next", exact=True)
        if not await following.count():
            return pages
        await follow(page, "Next")


async def follow(page: Page, name: str) -> None:
    """Click the pager's link ``name`` and wait for the page it leads to."""
    left = page.url
    await page.get_by_role("link", name=name, exact=True).click()
    await page.wait_for_url(lambda now: now != left)


def flat(pages: list[list[str]]) -> list[str]:
    return [run_id for ids in pages for run_id in ids]


async def apply_filters(page: Page, **fields: str) -> None:
    """Fill the form's fields by their labels (empty clears one) and apply them."""
    for label, value in fields.items():
        await page.get_by_label(label, exact=True).fill(value)
    await page.get_by_role("button", name="Apply filters").click()


async def expect_count(page: Page, count: int) -> None:
    noun = "run" if count == 1 else "runs"
    await expect(page.locator("#run-count")).to_contain_text(re.compile(rf"^\s*{count} {noun}[;.]"))


async def _failed(server: RunqServer, expected: int, status: str = "failed") -> bool:
    response = await server.request("GET", "/queue/stats", headers=bearer())
    counts: dict[str, int] = response.json()["counts"]
    return counts.get(status, 0) == expected


async def test_filters_and_cursor_pages_over_5000_runs(
    serve_factory: ServeFactory, runq_setup: RunqSetup, runq_engine: str, tmp_path: Path
) -> None:
    server = await start_console(serve_factory)
    async with runq_setup.queue() as queue:
        dead_ids = await queue.store.submit_many(
            [NewRun(component_type="task", component_id="fail_first") for _ in range(100)]
        )
        seeds, boundary = await seed_runs(queue)
    await wait_for(lambda: _failed(server, 100), timeout=SETTLE * 3, message="100 dead letters")
    everything = {s.id for s in seeds} | set(dead_ids)
    async with chromium() as browser:
        page = await new_page(browser)
        await sign_in(page, server, API_KEY, start="/ui/queue/jobs?limit=200")
        await expect_count(page, SEEDED + 100)

        # Forward through every page by cursor; runs submitted mid-walk are newer than
        # the first page, so they shift nothing: no gap, no repeat.
        submitted: list[str] = []

        async def submit_mid_walk(number: int) -> None:
            if number == 3:
                for _ in range(5):
                    submitted.append(await submit(server, "task/echo", delay_seconds=FAR_FUTURE))

        pages = await walk_forward(page, on_page=submit_mid_walk)
        walked = flat(pages)
        assert len(pages) == math.ceil((SEEDED + 100) / 200)
        assert len(walked) == len(set(walked)), "a run was shown twice"
        assert set(walked) == everything, f"{len(everything - set(walked))} runs never shown"
        # Back one page: the rows just before the last page, as shown on the way.
        await follow(page, "Previous")
        assert await shown_ids(page) == pages[-2]
        await page.get_by_role("link", name="First", exact=True).click()
        await expect_count(page, SEEDED + 105)
        assert set(submitted) <= set(await shown_ids(page))

        # Each filter narrows to exactly the runs it names (count, and every row shown).
        cases: list[tuple[dict[str, str], Callable[[Seed], bool], int]] = [
            ({"Component": "task/sleep"}, lambda s: s.component == "task/sleep", 0),
            ({"Component": "task/sleep*"}, lambda s: s.component.startswith("task/sleep"), 0),
            ({"Component": "task/*"}, lambda s: True, 100 + 5),
            ({"Component": "", "Session": "s-3"}, lambda s: s.session == "s-3", 0),
            ({"Session": "", "User": "alice"}, lambda s: s.user == "alice", 0),
            ({"User": "", "Deployment": "eu"}, lambda s: s.deployment == "eu", 0),
        ]
        for fields, matches, extra in cases:
            await apply_filters(page, **fields)
            expected = {s.id for s in seeds if matches(s)}
            await expect_count(page, len(expected) + extra)
            if not extra:
                assert set(await shown_ids(page)) <= expected, fields
        await apply_filters(page, Deployment="", **{"Created from (UTC)": _local(boundary)})
        await expect_count(page, sum(s.late for s in seeds) + 5)
        await apply_filters(
            page,
            **{"Created from (UTC)": "", "Created before (UTC)": _local(boundary)},
        )
        early = {s.id for s in seeds if not s.late} | set(dead_ids)
        await expect_count(page, len(early))
        assert set(await shown_ids(page)) <= early

        # Several at once, walked to the end: exactly the matching runs, each once.
        await apply_filters(
            page,
            Component="task/sleep*",
            User="alice",
            **{"Created before (UTC)": "", "Created from (UTC)": _local(boundary)},
        )
        combined = {
            s.id for s in seeds if s.component.startswith("task/sleep") and s.user == "alice"
        }
        combined = combined & {s.id for s in seeds if s.late}
        await expect_count(page, len(combined))
        assert "user=alice" in page.url
        assert "created_after=" in page.url
        await assert_accessible(page)
        walked = flat(await walk_forward(page))
        assert sorted(walked) == sorted(combined)
        # For the docs: a later page of a filtered table, small enough to show whole.
        await page.goto(page.url.replace("limit=200", "limit=20").split("&cursor=")[0])
        await page.get_by_role("link", name="Next", exact=True).click()
        await page.wait_for_url(re.compile("cursor="))
        await expect(page.locator("tr[data-run-id]")).to_have_count(20)
        await assert_accessible(page)
        if runq_engine == "sqlite":
            await screenshot(page, "runs-filtered", tmp_path)

        # Sorting by another column pages by number, and says so.
        await page.get_by_role("link", name=re.compile("^Priority")).click()
        await expect(page.locator("#paging-help")).to_contain_text("pages are numbered")
        await expect(page.get_by_role("link", name="Last", exact=True)).to_be_visible()
        assert "cursor" not in page.url

        # 100 dead letters: filtered, one page of 100, all selected, requeued at once.
        await page.goto(f"{server.url}/ui/queue/jobs")
        await page.get_by_role("checkbox", name="failed", exact=True).check()
        await page.get_by_label("Per page").select_option("100")
        await page.get_by_role("button", name="Apply filters").click()
        await expect_count(page, 100)
        await expect(page.locator("tr[data-run-id] .badge")).to_have_text(["failed"] * 100)
        await page.get_by_label("Select every run on this page").check()
        await expect(page.locator("input[name=ids]:checked")).to_have_count(100)
        await page.get_by_role("checkbox", name=re.compile("^force")).check()
        await page.get_by_role("button", name="Requeue", exact=True).click()
        await expect(page.get_by_role("status")).to_contain_text("100 of 100 runs requeued")
        await assert_accessible(page)
    await wait_for(
        lambda: _failed(server, 100, "completed"),
        timeout=SETTLE * 3,
        message="the 100 requeued runs complete",
    )


async def test_live_rows_follow_a_filtered_later_page(
    serve_factory: ServeFactory, runq_setup: RunqSetup, runq_engine: str
) -> None:
    server = await start_console(serve_factory)
    async with runq_setup.queue() as queue:
        await queue.store.submit_many([_new(i) for i in range(300)])
    async with chromium() as browser:
        page = await new_page(browser)
        streams: list[str] = []
        page.on("request", lambda r: streams.append(r.url) if "/live" in r.url else None)
        await sign_in(page, server, API_KEY, start="/ui/queue/jobs?component=task/sleep&limit=20")
        await expect_count(page, 100)
        await page.get_by_role("link", name="Next", exact=True).click()
        await page.wait_for_url(re.compile("cursor="))
        second = await shown_ids(page)
        assert len(second) == 20

        # A matching run submitted now belongs to the first page, and a run of this page
        # that changes follows without a reload, through the one stream the page holds,
        # whose URL carries the page's filter and cursor.
        newest = await submit(server, "task/sleep", delay_seconds=FAR_FUTURE)
        target = second[7]
        cancelled = await server.request(
            "POST", "/queue/jobs/cancel", json={"ids": [target]}, headers=bearer()
        )
        assert cancelled.status_code == 200, cancelled.text
        await expect(page.locator(f'tr[data-run-id="{target}"] .badge')).to_have_text("cancelled")
        await expect_count(page, 101)
        assert await shown_ids(page) == second
        live = [url for url in streams if "/ui/queue/jobs/live" in url]
        assert len(live) == 2, live  # the first page's, then this one's
        assert "component=task%2Fsleep" in live[-1]
        assert "cursor=" in live[-1]

        # On the first page: a matching run submitted now shows live; one that does not
        # match never does.
        await page.get_by_role("link", name="First", exact=True).click()
        await expect(page.locator(f'tr[data-run-id="{newest}"]')).to_be_visible()
        other = await submit(server, "task/echo", delay_seconds=FAR_FUTURE)
        matching = await submit(server, "task/sleep", delay_seconds=FAR_FUTURE)
        await expect(page.locator(f'tr[data-run-id="{matching}"]')).to_be_visible()
        await expect_count(page, 102)
        assert other not in await shown_ids(page)


async def test_a_user_without_admin_scope_filters_only_their_own_runs(
    serve_factory: ServeFactory, runq_setup: RunqSetup, runq_engine: str
) -> None:
    server = await start_console(serve_factory, auth="jwt")

    def run(i: int, actor: Actor) -> NewRun:
        return NewRun(
            component_type="task",
            component_id=COMPONENTS[i % 3],
            session_id=f"s-{i % 2}",
            actor=actor,
            deployment_id="eu",
            delay_seconds=FAR_FUTURE,
        )

    async with runq_setup.queue() as queue:
        own = await queue.store.submit_many([run(i, Actor(user_id="alice")) for i in range(120)])
        # Not alice's: bob's, and a service account's that happens to carry her name.
        await queue.store.submit_many([run(i, Actor(user_id="bob")) for i in range(120)])
        robot = Actor(user_id="alice", service_account=True)
        await queue.store.submit_many([run(i, robot) for i in range(60)])
    sleeping = {run_id for i, run_id in enumerate(own) if COMPONENTS[i % 3] == "sleep"}
    sleep_s1 = {run_id for i, run_id in enumerate(own) if i % 3 == 1 and i % 2 == 1}

    async with chromium() as browser:
        page = await new_page(browser)
        await sign_in(page, server, mint("alice"))
        assert page.url.endswith("/ui/runs")
        await expect_count(page, 120)
        # No user or deployment filter for her: they choose among other users' runs.
        await expect(page.get_by_label("User", exact=True)).to_have_count(0)
        await expect(page.get_by_label("Deployment", exact=True)).to_have_count(0)

        await apply_filters(page, Component="task/sleep", Session="s-1")
        await expect_count(page, len(sleep_s1))
        assert set(await shown_ids(page)) == sleep_s1
        await assert_accessible(page)

        # Asking for someone else's runs in the URL changes nothing.
        await page.goto(f"{server.url}/ui/runs?component=task/sleep&user=bob&limit=20")
        await expect_count(page, len(sleeping))
        walked = flat(await walk_forward(page))
        assert sorted(walked) == sorted(sleeping)

        response = await page.goto(f"{server.url}/ui/runs?created_after=soon")
        assert response is not None
        assert response.status == 400
        await expect(page.get_by_role("alert")).to_contain_text("created_after")
        await assert_accessible(page)
