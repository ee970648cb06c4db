"""Finding 7 (CLI part): the operator's terminal is safe from what runs carry.

A run's error is text from outside (an exception message, an upstream body). Rendered as
rich markup, ``[/]`` in it crashed ``runq jobs list``/``show`` for as long as the run was
kept; raw escape sequences (an OSC 52 clipboard write) reached the terminal.
"""

from __future__ import annotations

import pytest
from serve_harness import RunqSetup, pg_ready, runq_engine, runq_setup
from store.factories import make_run

from runq.cli.render import printable
from runq.model import Status

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["pg_ready", "runq_engine", "runq_setup"]  # fixtures used by name

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"
HOSTILE_ERROR = f"boom [/] [bold]x[/bold] [link=http://evil.example]y {OSC52} \x9b31m \u202e"


async def test_hostile_run_error_neither_crashes_nor_reaches_the_terminal(
    runq_setup: RunqSetup,
) -> None:
    async with runq_setup.queue() as q:
        run = await make_run(q.store, Status.FAILED, error=HOSTILE_ERROR)

    listed = await runq_setup.cli("jobs", "list")
    shown = await runq_setup.cli("jobs", "show", run.id)
    for result in (listed, shown):
        assert result.returncode == 0, result.stderr
        assert "\x1b" not in result.stdout
        assert "\x9b" not in result.stdout
        assert "\u202e" not in result.stdout
    # Markup is shown as the literal text it is, not interpreted.
    assert "boom [/] [bold]x[/bold]" in shown.stdout
    assert "[link=http://evil.example]" in shown.stdout


def test_printable_strips_every_control_character() -> None:
    assert printable("a\x00b\x1b[2Jc\x7fd\x85e\tf\ng") == "ab[2Jcde f g"
