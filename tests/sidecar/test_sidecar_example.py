"""``examples/sidecar`` as a user runs it: the Node.js application, ``runq serve`` with the
example's ``runq.toml`` (only store, listen address and seal key replaced), and
``submit.sh`` driving both over HTTP with curl."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from helpers import wait_for
from serve_harness import REPO_DIR, RunqServer, ServeFactory

from sidecar.sidecar_servers import free_port

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.daemon,
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
    pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed"),
]

EXAMPLE = REPO_DIR / "examples" / "sidecar"
TOKEN = "demo-token"


@pytest.fixture
def app_port() -> int:
    return free_port()


@pytest.fixture
def app_env(app_port: int) -> dict[str, str]:
    return {
        "APP_PORT": str(app_port),
        "APP_TOKEN": TOKEN,
        "APP_AUTHORIZATION": f"Bearer {TOKEN}",
        "APP_RENDER_URL": f"http://127.0.0.1:{app_port}/render",
        "OPENAI_BASE_URL": f"http://127.0.0.1:{app_port}/v1",
        "OPENAI_API_KEY": "demo-key",
    }


def example_config() -> dict[str, Any]:
    config = tomllib.loads((EXAMPLE / "runq.toml").read_text())
    # The test's database, port and seal key replace these; everything else is as shipped.
    for section in ("store", "http"):
        config.pop(section, None)
    return config


@contextmanager
def node_app(env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["node", str(EXAMPLE / "app.js")],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield process
        finally:
            process.terminate()
            process.wait(timeout=10)


async def app_ready(port: int) -> bool:
    try:
        async with httpx.AsyncClient(timeout=1) as client:
            return (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
    except httpx.HTTPError:
        return False


async def submit_sh(server: RunqServer, app_url: str, *args: str) -> str:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", str(EXAMPLE / "submit.sh"), *args],
            env={**os.environ, "RUNQ_URL": server.url, "APP_URL": app_url},
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )

    result = await anyio.to_thread.run_sync(run)
    assert result.returncode == 0, f"submit.sh {args}: {result.stderr}\n{result.stdout}"
    return result.stdout


def compact(output: str) -> str:
    """submit.sh pretty-prints with jq when it is installed; compare without spaces."""
    return output.replace(" ", "").replace("\n", "")


@pytest.mark.parametrize("engine", ["sqlite"])
async def test_the_example_runs_end_to_end(
    serve_factory: ServeFactory, app_env: dict[str, str], app_port: int, tmp_path: Path
) -> None:
    server = await serve_factory(example_config(), env=app_env)
    with node_app({**app_env, "RUNQ_URL": server.url}, tmp_path / "app.log"):
        await wait_for(lambda: app_ready(app_port), timeout=10, message="app.js listens")
        app_url = f"http://127.0.0.1:{app_port}"

        rendered = compact(await submit_sh(server, app_url, "render", "Q3-report"))
        assert '"status":"completed"' in rendered
        assert "<h1>Q3-report</h1>" in rendered

        approved = compact(await submit_sh(server, app_url, "approve", "Q3-report"))
        assert '"status":"paused"' in approved
        assert '"pause_reason":"approval"' in approved
        assert '"published":true' in approved

        slow = compact(await submit_sh(server, app_url, "slow", "Q3-report"))
        assert '"status":"completed"' in slow

        summary = await submit_sh(
            server, app_url, "summarize", "runq runs background work beside any app"
        )
        assert "runq runs background work beside ..." in summary

        # The application submits a run itself, then runq calls it back.
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.post(f"http://127.0.0.1:{app_port}/documents/Q4/render")
        assert response.status_code == 202, response.text
        run_id = response.json()["run_id"]

        async def completed() -> bool:
            view = (await server.request("GET", f"/runs/{run_id}")).json()
            return bool(view["status"] == "completed" and view["answer"]["html"] == "<h1>Q4</h1>")

        await wait_for(completed, timeout=20, message="the app's own run completes")
