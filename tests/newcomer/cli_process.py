"""Run the ``runq`` command line as a user types it: options anywhere, output piped or on a
pseudo-terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from serve_harness import RunqSetup


def run(
    setup: RunqSetup, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``python -m runq ARGS`` exactly as given (no ``--config`` added), output piped."""
    return subprocess.run(
        [sys.executable, "-m", "runq", *args],
        cwd=setup.workdir,
        env=setup.env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_on_terminal(
    setup: RunqSetup, *args: str, columns: int, timeout: float = 60.0
) -> tuple[int, str]:
    """``python -m runq ARGS`` with stdout and stderr on a pseudo-terminal ``columns`` wide;
    returns the exit code and everything it printed."""
    master, slave = pty.openpty()
    env = setup.env({"COLUMNS": str(columns), "LINES": "50", "TERM": "xterm"})
    process = subprocess.Popen(
        [sys.executable, "-m", "runq", *args],
        cwd=setup.workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    output = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed its side
                    break
                if not chunk:
                    break
                output.extend(chunk)
            elif process.poll() is not None:
                break
        code = process.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    return code, output.decode(errors="replace").replace("\r\n", "\n")


class TerminalServe:
    """``runq serve`` with stderr on a pseudo-terminal, read as it arrives."""

    def __init__(self, setup: RunqSetup, config: Path) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runq", "serve", "--config", str(config)],
            cwd=setup.workdir,
            env=setup.env({"COLUMNS": "100", "TERM": "xterm"}),
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
        )
        os.close(slave)
        self.output = bytearray()

    def text(self) -> str:
        """Everything printed so far (reads what is waiting, never blocks)."""
        while select.select([self.master], [], [], 0)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.output.extend(chunk)
        return self.output.decode(errors="replace").replace("\r\n", "\n")

    def close(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.text()
        os.close(self.master)
        return self.process.returncode
