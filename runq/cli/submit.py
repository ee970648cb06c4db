"""``enqueue`` and ``defer``: submit a run from the command line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from runq.cli.options import CliContext, common_options, read_json_arg, run_async, split_component
from runq.cli.render import echo_json
from runq.model import Actor, Run


def submit_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.argument("component"),
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
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _submit(cli_ctx: CliContext, background: bool, **opts: Any) -> None:
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
@common_options
def defer_cmd(cli_ctx: CliContext, **opts: Any) -> None:
    """Store a run for a sweep or a daemon; never executes here. Prints the run."""
    _submit(cli_ctx, True, **opts)
