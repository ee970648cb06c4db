"""``runq jobs``: list, show, requeue, cancel and continue runs."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import click

from runq.api.listing import decoded_cursor, run_filter
from runq.cli.options import CliContext, common_options, read_json_arg, run_async
from runq.cli.render import echo_json, job_row, new_console, print_report, print_run
from runq.errors import BadRequest
from runq.listing import Page, RunCursor, RunFilter
from runq.model import Run, Status, WaitReason
from runq.ops.views import OPERATOR_VIEW, RunView

if TYPE_CHECKING:
    from runq.queue import Queue


@click.group("jobs")
def jobs() -> None:
    """List, show, requeue, cancel and continue runs (the /queue operator surface).

    RUN_ID is a whole run id or a prefix that starts exactly one (as with git commits).
    """


@jobs.command("list")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([s.value for s in Status]),
    help="Repeat to match several.",
)
@click.option("--component", default=None, help="type/id, type/*, type/prefix* or *.")
@click.option("--session", default=None, help="Only runs of this session.")
@click.option("--user", default=None, help="Only this user's runs.")
@click.option("--deployment", default=None, help="Only runs of this deployment ('' = none).")
@click.option("--created-after", default=None, help="Epoch seconds or ISO 8601 (inclusive).")
@click.option("--created-before", default=None, help="Epoch seconds or ISO 8601 (exclusive).")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--cursor", default=None, help="next_cursor of a previous listing.")
@click.option("--sort-by", default="created_at", show_default=True)
@click.option("--sort-order", type=click.Choice(["asc", "desc"]), default="desc", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@common_options
def jobs_list(cli_ctx: CliContext, **opts: Any) -> None:
    """Runs, newest first by default. Sorted by created_at, a listing that has more runs
    prints its next cursor; pass it as --cursor for the next page."""
    where, after = _listing_args(opts)

    async def go() -> Page:
        async with cli_ctx.operations() as ops:
            return await ops.list_jobs(
                where=where,
                page=opts["page"],
                limit=opts["limit"],
                sort_by=opts["sort_by"],
                sort_order=opts["sort_order"],
                after=after,
            )

    page = run_async(go)
    if opts["as_json"]:
        data = [RunView.of(r, OPERATOR_VIEW) for r in page.data]
        meta = {
            "page": page.page,
            "limit": page.limit,
            "total_count": page.total_count,
            "total_pages": page.total_pages,
        }
        echo_json({"data": data, "meta": meta, "next_cursor": page.next_cursor})
        return
    _print_jobs(page)


def _listing_args(opts: dict[str, Any]) -> tuple[RunFilter, RunCursor | None]:
    """The filter and cursor of ``jobs list``; a bad value exits 2 with the reason."""
    try:
        where = run_filter(
            status=[Status(s) for s in opts["statuses"]],
            component=opts["component"],
            session_id=opts["session"],
            user_id=opts["user"],
            deployment_id=opts["deployment"],
            created_after=opts["created_after"],
            created_before=opts["created_before"],
        )
        after = decoded_cursor(opts["cursor"])
    except BadRequest as e:
        raise click.UsageError(str(e)) from e
    if after is not None and (opts["sort_by"] != "created_at" or opts["page"] != 1):
        raise click.UsageError("--cursor pages only with --sort-by created_at and --page 1")
    return where, after


def _print_jobs(page: Page) -> None:
    from rich.table import Table

    table = Table("id", "component", "status", "attempt", "created (UTC)", "error")
    # An id is shown whole or not at all: a cut one cannot be pasted back. The other
    # columns give way first; only a terminal narrower than an id folds it.
    ids = table.columns[0]
    ids.no_wrap, ids.overflow = True, "fold"
    ids.min_width = max((len(run.id) for run in page.data), default=2)
    for run in page.data:
        table.add_row(*job_row(run))
    console = new_console()
    if not console.is_terminal:
        # Piped: nothing to fit, so nothing is cut (the table is only as wide as its cells).
        console.width = 1000
    console.print(table)
    console.print(f"page {page.page} of {max(page.total_pages, 1)} ({page.total_count} runs)")
    if page.next_cursor:
        console.print(f"next: --cursor {page.next_cursor}", soft_wrap=True)


async def _one(
    cli_ctx: CliContext, run_id: str, verb: Callable[[Queue, str], Awaitable[Run | None]]
) -> Run | None:
    """``verb`` on the run ``run_id`` names: a whole id or a unique prefix of one."""
    async with cli_ctx.both() as (q, ops):
        return await verb(q, await ops.resolve_run_id(run_id))


@jobs.command("show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@common_options
def jobs_show(cli_ctx: CliContext, run_id: str, as_json: bool) -> None:
    """One run, all fields, a queued run's reason for waiting, and the handler's whole
    error message (error_detail, opened from its sealed column: the CLI is the operator)."""

    async def go() -> tuple[Run | None, WaitReason | None, str | None]:
        async with cli_ctx.operations() as ops:
            run = await ops.get(await ops.resolve_run_id(run_id))
            if run is None:
                return None, None, None
            return run, await ops.why_waiting(run), await ops.error_detail(run.id)

    run, waiting, detail = run_async(go)
    if run is None:
        click.echo(f"runq: no run {run_id}", err=True)
        sys.exit(1)
    print_run(run, as_json, waiting=waiting, error_detail=detail)


@jobs.command("requeue")
@click.argument("run_id")
@click.option("--clear-cancellation", is_flag=True, help="Also clear a recorded cancel.")
@click.option("--force", is_flag=True, help="Even within lock_grace_seconds of its failure.")
@click.option("--json", "as_json", is_flag=True)
@common_options
def jobs_requeue(
    cli_ctx: CliContext, run_id: str, clear_cancellation: bool, force: bool, as_json: bool
) -> None:
    """Give a failed or cancelled run one more attempt."""
    run = run_async(
        lambda: _one(
            cli_ctx,
            run_id,
            lambda q, full: q.requeue(full, clear_cancellation=clear_cancellation, force=force),
        )
    )
    assert run is not None
    print_report(run, as_json)


@jobs.command("cancel")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@common_options
def jobs_cancel(cli_ctx: CliContext, run_id: str, as_json: bool) -> None:
    """Cancel a run (a running one stops at its next checkpoint or heartbeat)."""
    run = run_async(lambda: _one(cli_ctx, run_id, lambda q, full: q.cancel(full)))
    assert run is not None
    print_report(run, as_json)


@jobs.command("continue")
@click.argument("run_id")
@click.option("--decision", default="null", show_default=True, help="JSON, @FILE or -.")
@click.option("--json", "as_json", is_flag=True)
@common_options
def jobs_continue(cli_ctx: CliContext, run_id: str, decision: str, as_json: bool) -> None:
    """Continue a paused run with a decision."""
    value = read_json_arg(decision, "--decision")
    run = run_async(lambda: _one(cli_ctx, run_id, lambda q, full: q.continue_(full, value)))
    assert run is not None
    print_report(run, as_json)


# Following a run lives in its own module; registered here so it reads `runq jobs ...`.
from runq.cli.follow import jobs_events, jobs_wait  # noqa: E402

jobs.add_command(jobs_events)
jobs.add_command(jobs_wait)
