"""``runq pause``, ``runq resume`` and ``runq pauses``: stop and restart claims of a
component pattern or a deployment on every replica at once.

A pause is a row in the database that every claim consults, so it needs no running
daemon here and takes effect with each replica's next claim; runs already running finish.
"""

from __future__ import annotations

import sys

import click

from runq.cli.options import CliContext, common_options, run_async
from runq.cli.render import echo_json, format_time, new_console
from runq.limits import MAX_PAUSE_REASON_CHARS, pause_target_problem
from runq.model import Pause

EXIT_NOT_FOUND = 1


def print_pauses(pauses: list[Pause]) -> None:
    if not pauses:
        return
    from rich.table import Table

    table = Table("id", "paused", "since (UTC)", "by", "reason", title="active pauses")
    for p in pauses:
        table.add_row(
            p.id,
            f"{p.kind} {p.target}",
            format_time(p.created_at),
            p.created_by or "-",
            p.reason or "-",
        )
    new_console().print(table)


def _kind(deployment: bool) -> str:
    return "deployment" if deployment else "component"


@click.command("pause")
@click.argument("target")
@click.option("--deployment", is_flag=True, help="TARGET is a deployment id, not a component.")
@click.option("--reason", default=None, help="Shown with the pause and on the runs it holds.")
@click.option("--json", "as_json", is_flag=True)
@common_options
def pause_cmd(
    cli_ctx: CliContext, target: str, deployment: bool, reason: str | None, as_json: bool
) -> None:
    """Pause a component pattern (agent/summarize, agent/*) or, with --deployment, a
    deployment: no replica claims its queued runs until `runq resume`."""
    kind = _kind(deployment)
    problem = pause_target_problem(kind, target)
    if problem is None and reason is not None and len(reason) > MAX_PAUSE_REASON_CHARS:
        problem = f"--reason is longer than {MAX_PAUSE_REASON_CHARS} characters"
    if problem is not None:
        raise click.BadParameter(problem)

    async def go() -> tuple[Pause, bool]:
        async with cli_ctx.operations() as ops:
            by = cli_ctx.config.cli.service_account
            return await ops.add_pause(kind, target, reason=reason, created_by=by)

    pause, created = run_async(go)
    if as_json:
        echo_json({"pause": pause, "created": created})
    else:
        state = "paused" if created else "already paused"
        click.echo(f"{state}: {pause.kind} {pause.target} ({pause.id})")


@click.command("resume")
@click.argument("target")
@click.option("--deployment", is_flag=True, help="TARGET is a deployment id, not a component.")
@click.option("--json", "as_json", is_flag=True)
@common_options
def resume_cmd(cli_ctx: CliContext, target: str, deployment: bool, as_json: bool) -> None:
    """Resume a paused component pattern or deployment (TARGET as paused, or a pause id)."""

    async def go() -> Pause | None:
        async with cli_ctx.operations() as ops:
            return await ops.remove_pause(target, kind=_kind(deployment), target=target)

    pause = run_async(go)
    if pause is None:
        click.echo(f"runq: nothing paused as {target}", err=True)
        sys.exit(EXIT_NOT_FOUND)
    if as_json:
        echo_json(pause)
    else:
        click.echo(f"resumed: {pause.kind} {pause.target}")


@click.command("pauses")
@click.option("--json", "as_json", is_flag=True)
@common_options
def pauses_cmd(cli_ctx: CliContext, as_json: bool) -> None:
    """List active pauses."""

    async def go() -> list[Pause]:
        async with cli_ctx.operations() as ops:
            return await ops.list_pauses()

    pauses = run_async(go)
    if as_json:
        echo_json({"data": pauses})
    elif pauses:
        print_pauses(pauses)
    else:
        click.echo("no active pauses")
