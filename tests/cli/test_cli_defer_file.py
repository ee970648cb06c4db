"""``runq defer --from-file`` as a subprocess on both engines: batches through defer_many,
a JSON summary, exit 1 naming bad lines with nothing stored, idempotency keys honoured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_harness import RunqSetup, runq_engine, runq_setup  # fixtures are used by name

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup"]


def write_lines(path: Path, lines: list[object]) -> str:
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return str(path)


async def queued(setup: RunqSetup) -> int:
    async with setup.queue() as q:
        return int((await q.store.stats()).counts.get("queued", 0))


async def test_defer_from_file(runq_setup: RunqSetup) -> None:
    good = [
        {
            "component": "task/echo",
            "payload": {"i": i},
            "options": {"idempotency_key": f"k{i % 1500}"},
        }
        for i in range(2500)
    ]
    path = write_lines(runq_setup.workdir / "runs.jsonl", good)
    config = runq_setup.write_config({"queue": {"max_queue_depth": 5000}})
    done = await runq_setup.cli("defer", "--from-file", path, "--json", config=config)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["lines"], summary["created"], summary["existing"]) == (2500, 1500, 1000)
    assert done.stderr == ""  # not a terminal: no progress bar
    assert await queued(runq_setup) == 1500

    bad = [good[0], "{oops", {"component": "task/echo", "options": {"prio": 1}}, {"x": 1}]
    path = write_lines(runq_setup.workdir / "bad.jsonl", [{"component": "task/echo"}, *bad])
    refused = await runq_setup.cli("defer", "--from-file", path, config=config)
    assert refused.returncode == 1
    assert [ln.split(":")[1] for ln in refused.stderr.splitlines()[:3]] == ["3", "4", "5"]
    assert "nothing was stored" in refused.stderr
    assert await queued(runq_setup) == 1500
