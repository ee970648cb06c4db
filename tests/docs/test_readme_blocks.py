"""The README followed top to bottom, as a newcomer does, in a fresh copy of the checkout.

Every block marked ``<!-- test: walkthrough ... -->`` runs exactly as printed, in
document order, with ``bash -euo pipefail`` in one fresh directory. Under ``CI=true``
(or with ``RUNQ_DOCS_FRESH_VENV=1``) the install block runs too: it creates ``.venv`` and
installs runq into it, which takes a minute or more; elsewhere the fresh directory links
this checkout's ``.venv`` instead, which holds the same code. The ``daemon`` block runs in the
background like the user's first shell and must answer ``/readyz``; ``file=NAME`` blocks
are saved as the prose says; ``stop=daemon`` sends the daemon Ctrl-C (SIGINT) first, as
the prose asks, and its drain must exit 0. Whatever a block leaves running in the
background is stopped at the end. A block that fails, a daemon that does not come up, or
an output that no longer says what the README promises fails the test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import wait_for_sync

from docs.markdown_blocks import README, ROOT, Block, copy_checkout, marked_blocks

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
FRESH_VENV = IN_CI or os.environ.get("RUNQ_DOCS_FRESH_VENV") == "1"
DAEMON_URL = "http://127.0.0.1:7777"  # the README's address, as printed
APP_PORT = 8080  # examples/sidecar/app.js, as printed
INSTALL_TIMEOUT = 300.0
BLOCK_TIMEOUT = 120.0
PORT_WAIT = 120.0  # another run of this test (or a daemon of the user's) may hold a port

pytestmark = [pytest.mark.daemon, pytest.mark.timeout(900)]


def require(tool: str) -> None:
    if shutil.which(tool) is None:
        if IN_CI:
            pytest.fail(f"{tool} is not installed; CI=true: the README walkthrough must run")
        pytest.skip(f"{tool} is not installed")


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_until(condition: Callable[[], bool], timeout: float, message: str) -> None:
    """The suite's deadline waiter, polling as often as a daemon start is worth."""
    wait_for_sync(condition, timeout=timeout, interval=0.2, message=f"timed out: {message}")


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def clean_environment() -> dict[str, str]:
    """The user's shell: no configuration leaking in from the test run's environment."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("RUNQ_", "PYTEST"))}


@dataclass
class Session:
    """The user's shells in one directory; every process group started is stopped at the end."""

    directory: Path
    env: dict[str, str]
    outputs: list[str] = field(default_factory=list)
    groups: list[subprocess.Popen[bytes]] = field(default_factory=list)
    daemon: subprocess.Popen[bytes] | None = None
    daemon_log: Path | None = None

    def start(self, block: Block, log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", block.text],
                cwd=self.directory,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: background jobs are stopped with it
            )
        self.groups.append(process)
        return process

    def run(self, block: Block, timeout: float) -> str:
        log = self.directory.parent / f"block-{block.line}.log"
        process = self.start(block, log)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{block.where()} did not finish within {timeout:.0f}s:\n{log.read_text()}")
        output = log.read_text(errors="replace")
        assert code == 0, f"{block.where()} exited {code}:\n{block.text}\n--- output\n{output}"
        self.outputs.append(output)
        return output

    def start_daemon(self, block: Block) -> None:
        wait_until(lambda: port_is_free(7777), PORT_WAIT, "port 7777 to be free")
        self.daemon_log = self.directory.parent / "daemon.log"
        self.daemon = self.start(block, self.daemon_log)
        daemon = self.daemon

        def up() -> bool:
            if daemon.poll() is not None:
                pytest.fail(f"{block.where()} exited {daemon.returncode}:\n{self.daemon_logs()}")
            return ready(f"{DAEMON_URL}/readyz")

        wait_until(up, 60, f"{block.where()} to answer /readyz:\n{self.daemon_logs()}")

    def stop_daemon(self) -> None:
        """Ctrl-C in the daemon's shell: SIGINT to its foreground group; a clean drain."""
        assert self.daemon is not None, "stop=daemon before any daemon block"
        os.killpg(self.daemon.pid, signal.SIGINT)
        try:
            code = self.daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the daemon did not drain within 60s:\n{self.daemon_logs()}")
        assert code == 0, f"the daemon exited {code} on Ctrl-C:\n{self.daemon_logs()}"
        self.daemon = None

    def daemon_logs(self) -> str:
        return self.daemon_log.read_text(errors="replace")[-4000:] if self.daemon_log else ""

    def close(self) -> None:
        for process in self.groups:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and group_alive(process.pid):
                    process.poll()
                    time.sleep(0.1)
                if not group_alive(process.pid):
                    break
            process.poll()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    checkout = copy_checkout(tmp_path / "checkout")
    shell = Session(checkout, clean_environment())
    try:
        yield shell
    finally:
        shell.close()


def walkthrough() -> list[Block]:
    blocks = marked_blocks(README, "walkthrough")
    assert blocks, "README.md marks no walkthrough blocks"
    return blocks


def test_the_walkthrough_covers_what_a_newcomer_is_told_to_run() -> None:
    """Install, daemon, the first submission, the Python program, the CLI tour, the
    requeue and the sidecar example are all marked, so none can drift untested."""
    blocks = walkthrough()
    text = "\n".join(b.text for b in blocks)
    assert [b for b in blocks if "install" in b.flags], "the install block is not marked"
    assert [b for b in blocks if "daemon" in b.flags], "the daemon block is not marked"
    assert {b.file for b in blocks if b.file} == {"agents.py", "runq.toml"}
    for command in (
        "localhost:7777/runs",
        "python agents.py",
        "runq work",
        "runq jobs list",
        "requeue?force=true",
        "examples/sidecar/submit.sh",
    ):
        assert command in text, f"no marked block runs {command!r}"
    for block in blocks:
        assert block.language in ("bash", "python", "toml"), block.where()


def test_the_readme_runs_as_printed(session: Session) -> None:
    require("curl")
    require("node")
    for block in walkthrough():
        if block.file is not None:
            target = session.directory / block.file
            assert not target.exists(), f"{block.where()} would overwrite {block.file}"
            target.write_text(block.text, encoding="utf-8")
        elif "install" in block.flags and not FRESH_VENV:
            (session.directory / ".venv").symlink_to(ROOT / ".venv")
        elif "install" in block.flags:
            session.run(block, INSTALL_TIMEOUT)
        else:
            run_step(session, block)

    said = "\n".join(session.outputs).replace(" ", "")
    # What the README's comments promise each step prints.
    for promise in (
        '"status":"completed","answer":{"hello":"world"}',  # the first submission
        "completed{'receipt':'receipt-for-ops@example.com'}",  # python agents.py
        "stopped:",  # the tour's runq work sweep
        '"status":"failed"',  # task/fail
        '"status":"queued"',  # the forced requeue
        "<h1>Q3-report</h1>",  # the sidecar's render
        '"published":true',  # the sidecar's approval, continued
    ):
        assert promise in said, f"the README's output {promise!r} did not appear:\n{said[-3000:]}"
    assert_summaries_completed(session.directory)


def run_step(session: Session, block: Block) -> None:
    """A command block: stop the daemon first where the prose says so, then start a new
    daemon in the background, or run the block to its end."""
    if block.options.get("stop") == "daemon":
        session.stop_daemon()
    if "daemon" in block.flags:
        session.start_daemon(block)
        return
    if "examples/sidecar" in block.text:
        wait_until(lambda: port_is_free(APP_PORT), PORT_WAIT, f"port {APP_PORT} to be free")
    session.run(block, BLOCK_TIMEOUT)


def assert_summaries_completed(checkout: Path) -> None:
    """Both runs of agents.py completed: the enqueued one in the program, the deferred
    one by the daemon restarted with runq.toml."""
    listed = subprocess.run(
        [".venv/bin/runq", "jobs", "list", "--json", "--config", "runq.toml"],
        cwd=checkout,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    jobs = json.loads(listed.stdout)["data"]
    summaries = [job for job in jobs if job["component_id"] == "summarize"]
    assert [job["status"] for job in summaries] == ["completed", "completed"], summaries


def test_a_block_that_fails_fails_the_walkthrough(session: Session) -> None:
    """The runner does not swallow a broken command: any failing line fails its block."""
    broken = Block("walkthrough", frozenset(), {}, "bash", "true\nrunq-no-such-command\ntrue\n", 1)
    with pytest.raises(AssertionError, match="exited 127"):
        session.run(broken, BLOCK_TIMEOUT)


def test_a_mark_applies_only_to_the_fence_right_below_it(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- test: demo -->\n```bash\necho marked\n```\n\n"
        "<!-- test: demo -->\nSome prose.\n\n```bash\necho unmarked\n```\n",
        encoding="utf-8",
    )
    assert [b.text for b in marked_blocks(page, "demo")] == ["echo marked\n"]
