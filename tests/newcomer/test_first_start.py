"""A start that fails leaves nothing behind, and a start on a terminal says where things are."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_process import TerminalServe, run
from helpers import wait_for
from serve_harness import RunqSetup, free_port, sqlite_serve_factory, sqlite_setup

from runq.serve.supervisor import Supervisor

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["sqlite_serve_factory", "sqlite_setup"]  # fixtures used by name


def live_workers(setup: RunqSetup, config: Path) -> int:
    status = run(setup, "--config", str(config), "status", "--json", "--minimum-workers", "0")
    assert status.returncode == 0, status.stderr
    count: int = json.loads(status.stdout)["live_workers"]
    return count


async def refused_start(setup: RunqSetup, overrides: dict[str, Any]) -> tuple[str, Path]:
    config = setup.write_config(overrides)
    result = await anyio.to_thread.run_sync(lambda: run(setup, "serve", "--config", str(config)))
    assert result.returncode == 2, result.stderr
    return result.stderr, config


async def test_a_missing_api_key_is_refused_before_the_worker_registers(
    sqlite_setup: RunqSetup,
) -> None:
    stderr, config = await refused_start(
        sqlite_setup,
        {"http": {"listen": f"127.0.0.1:{free_port()}", "auth": "key", "key": "env:NO_SUCH_KEY"}},
    )
    assert "http.key" in stderr
    assert "worker.registered" not in stderr
    assert live_workers(sqlite_setup, config) == 0


async def test_a_busy_listen_address_is_refused_before_the_worker_registers(
    sqlite_setup: RunqSetup,
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        stderr, config = await refused_start(
            sqlite_setup, {"http": {"listen": f"127.0.0.1:{port}"}}
        )
    assert "http.listen" in stderr
    assert live_workers(sqlite_setup, config) == 0


class _ListenerFails(Supervisor):
    """A start that fails after the worker registered (here: its wake-up listener)."""

    async def _start_listener(self, services: Any) -> None:
        raise RuntimeError("the listener could not start")


async def test_a_start_that_fails_after_registering_removes_its_worker(
    sqlite_setup: RunqSetup,
) -> None:
    async with sqlite_setup.queue({"http": {"listen": ""}}) as queue:
        supervisor = _ListenerFails(queue)
        with pytest.raises(BaseExceptionGroup) as failure:
            await supervisor.run()
        assert failure.group_contains(RuntimeError, match="listener", depth=None)
        workers = await queue.store.list_workers(max_age_seconds=3600)
        assert [w.worker_id for w in workers] == []


async def test_serve_on_a_terminal_says_where_things_are(sqlite_setup: RunqSetup) -> None:
    port = free_port()
    config = sqlite_setup.write_config({"http": {"listen": f"127.0.0.1:{port}"}})
    serve = TerminalServe(sqlite_setup, config)
    try:
        text = await wait_for(
            lambda: (t := serve.text()) and "Stop with Ctrl+C" in t and t,
            timeout=60,
            message="serve prints its welcome on a terminal",
        )
    finally:
        serve.close()
    assert text.count("runq is ready.") == 1
    assert f"database:   {sqlite_setup.workdir / 'runq.db'}" in text
    assert str(sqlite_setup.key_file) in text  # the configured key file
    assert f"http://127.0.0.1:{port}  (auth: open)" in text
    assert f"http://127.0.0.1:{port}/ui" in text
    assert f"--config {config} defer task/echo --payload" in text


async def test_serve_without_a_terminal_prints_no_welcome(sqlite_serve_factory: Any) -> None:
    server = await sqlite_serve_factory()
    await server.terminate()
    assert "runq is ready." not in server.logs()
