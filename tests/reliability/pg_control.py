"""Stopping, starting and restarting the local PostgreSQL cluster for fault tests.

Uses ``pg_ctlcluster --skip-systemctl-redirect VERSION main ACTION`` (Debian's cluster
tools; the tests run as root on the CI machine). ``restore()`` always leaves the server
running and accepting connections; call it in a ``finally``. Where the cluster cannot be
controlled (no ``pg_ctlcluster``, not root, a PostgreSQL somewhere else), ``control_or_skip``
skips with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest
from helpers import wait_for

PG_ETC = Path("/etc/postgresql")
CLUSTER = "main"


class PostgresControl:
    def __init__(self, version: str, host: str, port: int) -> None:
        self.version = version
        self.host = host
        self.port = port
        self.events: list[tuple[float, str]] = []

    def _ctl(self, action: str) -> None:
        cmd = ["pg_ctlcluster", "--skip-systemctl-redirect", self.version, CLUSTER, action]
        if action in ("stop", "restart"):
            cmd += ["--", "-m", "fast"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        self.events.append((time.monotonic(), action))
        if result.returncode != 0 and not (
            action == "start" and "already running" in result.stderr
        ):
            raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")

    def is_ready(self) -> bool:
        result = subprocess.run(
            ["pg_isready", "-h", self.host, "-p", str(self.port), "-t", "2"],
            capture_output=True,
            timeout=10,
            check=False,
        )
        return result.returncode == 0

    async def wait_ready(self, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        async def ready() -> bool:
            return await anyio.to_thread.run_sync(self.is_ready)

        await wait_for(
            ready, timeout=timeout, interval=0.2, message="PostgreSQL accepts connections"
        )

    async def stop(self) -> None:
        await anyio.to_thread.run_sync(self._ctl, "stop")

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._ctl, "start")
        await self.wait_ready()

    async def restart(self) -> None:
        await anyio.to_thread.run_sync(self._ctl, "restart")
        await self.wait_ready()

    async def restore(self) -> None:
        """Whatever happened: running and ready again."""
        with anyio.CancelScope(shield=True):
            if not await anyio.to_thread.run_sync(self.is_ready):
                await anyio.to_thread.run_sync(self._ctl, "start")
            await self.wait_ready(timeout=120)


def control_or_skip(url: str) -> PostgresControl:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    if host not in ("127.0.0.1", "localhost", "::1"):
        pytest.skip(f"PostgreSQL at {host} is not local: this machine cannot restart it")
    if shutil.which("pg_ctlcluster") is None or shutil.which("pg_isready") is None:
        pytest.skip("no pg_ctlcluster/pg_isready: this machine cannot restart PostgreSQL")
    if os.geteuid() != 0:
        pytest.skip("restarting PostgreSQL needs root")
    versions = sorted(p.name for p in PG_ETC.iterdir()) if PG_ETC.is_dir() else []
    if len(versions) != 1 or not (PG_ETC / versions[0] / CLUSTER).is_dir():
        pytest.skip(f"expected exactly one cluster {CLUSTER!r} under {PG_ETC}, found {versions}")
    return PostgresControl(versions[0], host, port)
