"""Shared by the console tests: a real ``runq serve``, Debian's Chromium, axe-core.

No browser can be downloaded here, so Playwright drives the system Chromium
(``scripts/install-browser`` installs it). Without it these tests skip locally and fail
under ``CI=true``, where every test must run.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from helpers import wait_for
from playwright.async_api import Browser, Page, async_playwright, expect
from serve_harness import REPO_DIR, TESTS_DIR, RunqServer, ServeFactory

UI_TESTS_DIR = Path(__file__).resolve().parent
AXE_SCRIPT = UI_TESTS_DIR / "vendor" / "axe.min.js"
SCREENSHOT_DIR = REPO_DIR / "docs" / "console"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: Seconds for a run to reach a state on a live daemon (milliseconds normally).
SETTLE = 20.0

API_KEY = "console-test-key-0123456789abcdef"
JWT_SECRET = "console-jwt-secret-0123456789abcdef-0123456789abcdef-0123"
ADMIN_SCOPE = "runq:admin"

# Conditions on a live daemon (an exporter refresh, a run settling) can take seconds.
expect.set_options(timeout=SETTLE * 1000)

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def chromium_path() -> str:
    """Debian's Chromium; skip without it, except under CI=true (fail: the tests must run)."""
    found = os.environ.get("RUNQ_TEST_CHROMIUM") or shutil.which("chromium") or ""
    if not found or not Path(found).exists():
        reason = "Chromium is not installed (run scripts/install-browser)"
        if IN_CI:
            pytest.fail(f"{reason}; CI=true: the console tests must run")
        pytest.skip(reason)
    return found


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    executable = chromium_path()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


async def new_page(browser: Browser) -> Page:
    # bypass_csp: the console's policy allows only its own scripts; the axe scan is injected
    # by the test, not served by the console.
    context = await browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
    page = await context.new_page()
    page.set_default_timeout(SETTLE * 1000)
    return page


def server_env() -> dict[str, str]:
    paths = [str(UI_TESTS_DIR), str(TESTS_DIR), str(REPO_DIR), os.environ.get("PYTHONPATH", "")]
    return {
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "RUNQ_TEST_UI_KEY": API_KEY,
        "RUNQ_TEST_UI_JWT_SECRET": JWT_SECRET,
    }


def console_config(auth: str = "key") -> dict[str, Any]:
    http: dict[str, Any] = {"auth": auth}
    if auth == "key":
        http["key"] = "env:RUNQ_TEST_UI_KEY"
    elif auth == "jwt":
        http["jwt"] = {"secret": "env:RUNQ_TEST_UI_JWT_SECRET"}
    return {
        "http": http,
        "queue": {"poll_interval": 0.2},
        "routing": {"*": "local"},
        "components": {
            "task/fail_first": "ui_handlers:fail_first",
            "task/ui_ask": "ui_handlers:ask",
        },
        # Tests read a continued run's answer to see the decision the handler received.
        "privacy": {"keep_answer_after_approval": True},
    }


async def start_console(serve_factory: ServeFactory, auth: str = "key") -> RunqServer:
    return await serve_factory(console_config(auth), env=server_env())


def mint(sub: str, scope: str = "") -> str:
    claims: dict[str, Any] = {"sub": sub, "exp": int(time.time()) + 600}
    if scope:
        claims["scope"] = scope
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


def bearer(credential: str = API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


async def submit(
    server: RunqServer,
    component: str,
    payload: Any = None,
    *,
    credential: str = API_KEY,
    **fields: Any,
) -> str:
    component_type, _, component_id = component.partition("/")
    body = {"component_type": component_type, "component_id": component_id, "payload": payload}
    body.update(fields)
    response = await server.request("POST", "/runs", json=body, headers=bearer(credential))
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    return run_id


async def wait_status(
    server: RunqServer, run_id: str, *statuses: str, credential: str = API_KEY
) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        response = await server.request("GET", f"/runs/{run_id}", headers=bearer(credential))
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body if body["status"] in statuses else None

    result: dict[str, Any] = await wait_for(
        reached, timeout=SETTLE, message=f"run {run_id} reaches {'/'.join(statuses)}"
    )
    return result


async def sign_in(page: Page, server: RunqServer, credential: str, *, start: str = "/ui") -> None:
    """Through the form, as a person would: the label finds the field."""
    await page.goto(f"{server.url}{start}")
    await page.get_by_label("API key").or_(page.get_by_label("Access token (JWT)")).fill(credential)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_load_state()
    assert "/ui/signin" not in page.url, await page.content()


async def axe_violations(page: Page) -> list[dict[str, Any]]:
    """Serious and critical axe-core violations of the page as it is now."""
    if not await page.evaluate("typeof window.axe !== 'undefined'"):
        await page.add_script_tag(content=AXE_SCRIPT.read_text(encoding="utf-8"))
    result: dict[str, Any] = await page.evaluate("async () => await axe.run(document)")
    return [v for v in result["violations"] if v.get("impact") in ("serious", "critical")]


async def assert_accessible(page: Page) -> None:
    violations = await axe_violations(page)
    summary = [(v["id"], v["impact"], [n["target"] for n in v["nodes"]][:5]) for v in violations]
    assert not violations, f"axe violations on {page.url}: {summary}"


async def screenshot(page: Page, name: str, tmp_path: Path) -> Path:
    """Into docs/console/ when RUNQ_UPDATE_SCREENSHOTS=1 (to refresh the docs), else tmp."""
    target_dir = SCREENSHOT_DIR if os.environ.get("RUNQ_UPDATE_SCREENSHOTS") == "1" else tmp_path
    target_dir.mkdir(parents=True, exist_ok=True)
    path = target_dir / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0
    return path


def session_cookie(page_cookies: list[Any]) -> str:
    for cookie in page_cookies:
        if cookie["name"] == "runq_session":
            value: str = cookie["value"]
            return value
    raise AssertionError(f"no runq_session cookie among {[c['name'] for c in page_cookies]}")


def client_for(server: RunqServer, cookies: dict[str, str] | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, cookies=cookies or {}, timeout=10.0, follow_redirects=False
    )
