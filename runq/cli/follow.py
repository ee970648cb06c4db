"""``runq jobs events`` and ``runq jobs wait``: follow a run from the shell.

``events`` prints the run's stored events (``--follow``: then live ones until the final
event; ``--json``: one JSON object a line). ``wait`` blocks until the run is final or
paused and says how it ended in its exit status, for scripts:

    0 completed · 1 failed or cancelled · 2 no such run · 3 paused · 4 timed out
"""

from __future__ import annotations

import sys

import click
import msgspec

from runq.cli.options import CliContext, common_options, run_async
from runq.cli.render import format_time, print_run
from runq.model import Run, RunEvent, Status

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_NO_SUCH_RUN = 2
EXIT_PAUSED = 3
EXIT_TIMED_OUT = 4

_STATUS_EXIT = {
    Status.COMPLETED: EXIT_COMPLETED,
    Status.FAILED: EXIT_FAILED,
    Status.CANCELLED: EXIT_FAILED,
    Status.PAUSED: EXIT_PAUSED,
}
_json = msgspec.json.Encoder()


def _line(event: RunEvent) -> str:
    data = "" if event.data is None else " " + _json.encode(event.data).decode()
    return f"{event.seq:>6}  {format_time(event.at)}  a{event.attempt}  {event.kind}{data}"


@click.command("events")
@click.argument("run_id")
@click.option("--follow", "-f", is_flag=True, help="Keep printing live events until the final one.")
@click.option("--after", type=click.IntRange(min=0), default=0, help="Only events after this seq.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@common_options
def jobs_events(cli_ctx: CliContext, run_id: str, follow: bool, after: int, as_json: bool) -> None:
    """A run's events: lifecycle and what its handler emitted."""

    def show(event: RunEvent) -> None:
        click.echo(_json.encode(event).decode() if as_json else _line(event))

    async def go() -> bool:
        async with cli_ctx.both() as (q, ops):
            if await q.get(run_id) is None:
                return False
            if follow:
                async for event in q.events(run_id, after=after):
                    show(event)
                return True
            start = after
            while batch := await ops.list_events(run_id, after=start, limit=1000):
                for event in batch:
                    show(event)
                start = batch[-1].seq
            return True

    if not run_async(go):
        click.echo(f"runq: no run {run_id}", err=True)
        sys.exit(EXIT_NO_SUCH_RUN)


@click.command("wait")
@click.argument("run_id")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="Give up after this many seconds (exit 4). Default: wait as long as it takes.",
)
@click.option("--json", "as_json", is_flag=True)
@common_options
def jobs_wait(cli_ctx: CliContext, run_id: str, timeout: float | None, as_json: bool) -> None:
    """Wait until a run is final or paused. Exit 0 completed, 1 failed or cancelled,
    2 no such run, 3 paused, 4 timed out."""

    async def go() -> Run | None:
        async with cli_ctx.queue() as q:
            return await q.get(run_id) and await q.wait(run_id, timeout=timeout)

    run = run_async(go)
    if run is None:
        click.echo(f"runq: no run {run_id}", err=True)
        sys.exit(EXIT_NO_SUCH_RUN)
    print_run(run, as_json)
    sys.exit(_STATUS_EXIT.get(run.status, EXIT_TIMED_OUT))
