"""``runq schedules``: list the configured schedules, pause and resume them fleet-wide."""

from __future__ import annotations

import click

from runq.cli.options import CliContext, common_options, run_async
from runq.cli.render import echo_json, format_time, new_console
from runq.ops.schedules import ScheduleView


@click.group("schedules")
def schedules() -> None:
    """The ``[[schedules]]`` of the configuration and their state in the database."""


@schedules.command("list")
@click.option("--json", "as_json", is_flag=True)
@common_options
def schedules_list(cli_ctx: CliContext, as_json: bool) -> None:
    """Each schedule with its next and last fire, the run it made and whether it is paused."""

    async def go() -> list[ScheduleView]:
        async with cli_ctx.operations() as ops:
            return await ops.schedules()

    views = run_async(go)
    if as_json:
        echo_json(views)
        return
    if not views:
        click.echo("no schedules configured")
        return
    from rich.table import Table

    table = Table()
    for column in ("name", "cron", "tz", "next fire", "last fire", "last run id", "paused"):
        table.add_column(column)
    for v in views:
        table.add_row(
            v.name,
            v.cron,
            v.timezone,
            format_time(v.next_fire_at),
            format_time(v.last_fire_at),
            v.last_run_id or "-",
            "yes" if v.paused else "no",
        )
    new_console().print(table)


def _set_paused(cli_ctx: CliContext, name: str, paused: bool, as_json: bool) -> None:
    async def go() -> ScheduleView:
        async with cli_ctx.operations() as ops:
            return await ops.set_schedule_paused(name, paused=paused)

    view = run_async(go)
    if as_json:
        echo_json(view)
        return
    click.echo(f"{view.name} {'paused' if view.paused else 'resumed'}")


@schedules.command("pause")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@common_options
def schedules_pause(cli_ctx: CliContext, name: str, as_json: bool) -> None:
    """Stop NAME firing on every replica until resumed (runs already made are untouched)."""
    _set_paused(cli_ctx, name, True, as_json)


@schedules.command("resume")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@common_options
def schedules_resume(cli_ctx: CliContext, name: str, as_json: bool) -> None:
    """Fire NAME again from its next slot; slots that fell inside the pause do not fire."""
    _set_paused(cli_ctx, name, False, as_json)
