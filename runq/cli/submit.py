"""``enqueue`` and ``defer``: submit a run from the command line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from runq.cli.batch import defer_from_file
from runq.cli.options import CliContext, common_options, read_json_arg, run_async, split_component
from runq.cli.render import echo_json
from runq.model import Actor, Run


def submit_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.argument("component", required=False),
        click.option("--payload", default=None, help="JSON, @FILE or - (stdin)."),
        click.option("--session", default=None, help="Session id (one run at a time)."),
        click.option("--user", default=None, help="Run on behalf of this user id."),
        click.option("--idempotency-key", default=None),
        click.option("--max-attempts", type=click.IntRange(min=1), default=None),
        click.option("--deployment", default=None, help="Pin to a deployment id."),
        click.option(
            "--priority", type=int, default=0, show_default=True, help="Lower runs first."
        ),
        click.option("--delay", type=click.FloatRange(min=0), default=0.0, help="Seconds."),
        click.option(
            "--unique-key", default=None, help="At most one counting run per component and key."
        ),
        click.option(
            "--unique-for", type=float, default=None, help="Seconds a final run still counts."
        ),
        click.option(
            "--unique-state",
            "unique_states",
            multiple=True,
            help="Statuses that count (repeat; default: all).",
        ),
        click.option(
            "--concurrency-key", default=None, help="Counted by [limits] max_running_per_key."
        ),
        click.option(
            "--timeout",
            type=float,
            default=None,
            help="This run's handler deadline in seconds ([queue] max_timeout_seconds at most).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _submit(cli_ctx: CliContext, background: bool, **opts: Any) -> None:
    if opts["component"] is None:
        raise click.UsageError("give COMPONENT (TYPE/ID), or --from-file for runq defer")
    ctype, cid = split_component(opts["component"])
    payload = read_json_arg(opts["payload"], "--payload") if opts["payload"] is not None else None
    actor = Actor(user_id=opts["user"]) if opts["user"] else cli_ctx.cli_actor

    async def go() -> Run:
        async with cli_ctx.queue(migrate=True, components=True, create=True) as q:
            new = q.new_run(
                ctype,
                cid,
                payload,
                session_id=opts["session"],
                actor=actor,
                idempotency_key=opts["idempotency_key"],
                max_attempts=opts["max_attempts"],
                deployment_id=opts["deployment"],
                priority=opts["priority"],
                delay_seconds=opts["delay"],
                origin="cli",
                unique_key=opts["unique_key"],
                unique_for_seconds=opts["unique_for"],
                unique_states=opts["unique_states"] or None,
                concurrency_key=opts["concurrency_key"],
                timeout_seconds=opts["timeout"],
            )
            result, run = await q.submit(new, background=background)
            final: Run = run if run is not None else result.run
            return final

    echo_json(run_async(go))


@click.command("enqueue")
@submit_options
@common_options
def enqueue_cmd(cli_ctx: CliContext, **opts: Any) -> None:
    """Store a run and dispatch it (on a sync route: execute it here). Prints the run."""
    _submit(cli_ctx, False, **opts)


@click.command("defer")
@submit_options
@click.option(
    "--from-file",
    "from_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="JSON lines, one run each: {component, payload, options}; stored in batches.",
)
@click.option("--json", "as_json", is_flag=True, help="With --from-file: a JSON summary.")
@common_options
def defer_cmd(cli_ctx: CliContext, from_file: str | None, as_json: bool, **opts: Any) -> None:
    """Store a run for a sweep or a daemon; never executes here. Prints the run.

    With --from-file, every line of the file (checked first: one bad line stores nothing,
    exit 1 with its line number), in batches of 1000, each all or nothing."""
    if from_file is None:
        _submit(cli_ctx, True, **opts)
        return
    if opts["component"] is not None:
        raise click.UsageError("give COMPONENT or --from-file, not both")
    actor = Actor(user_id=opts["user"]) if opts["user"] else cli_ctx.cli_actor
    defer_from_file(cli_ctx, from_file, actor, as_json)
