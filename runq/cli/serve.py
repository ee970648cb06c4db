"""The commands that run the queue: ``serve``, ``migrate``, ``work``, ``reap``, ``purge``."""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING

import anyio
import click

from runq.cli.options import EXIT_USAGE, CliContext, common_options, run_async
from runq.cli.render import echo_json
from runq.components import ComponentRegistry
from runq.config import REAP_LIMIT, SWEEP_LIMIT, SWEEP_TIME_LIMIT_SECONDS, redact_url
from runq.log import get_logger
from runq.model import PurgeReport, ReapReport
from runq.store.notifications import WAKE_MESSAGE

if TYPE_CHECKING:
    from runq.store.base import Store

log = get_logger(__name__)


@click.command("serve")
@common_options
def serve_cmd(cli_ctx: CliContext) -> None:
    """Run the daemon: claimers, heartbeats, reaper, retention, HTTP API."""
    from runq.cli.first_run import welcome_text
    from runq.serve.supervisor import run_serve, serve
    from runq.worker.executor import live_handler_threads

    config = cli_ctx.config
    entry = serve
    if sys.stderr.isatty():
        # The guided first run: on a terminal, say once where things are and what to try.
        welcome = welcome_text(config, cli_ctx.config_path)
        entry = functools.partial(serve, on_ready=lambda: click.echo(welcome, err=True))
    code = run_serve(config, entry=entry)
    if live_handler_threads():
        # A plain-function handler still blocks a thread after the drain; the process
        # must still exit (its run was settled as interrupted).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


@click.command("migrate")
@common_options
def migrate_cmd(cli_ctx: CliContext) -> None:
    """Apply pending database migrations (safe while replicas run) and record the fleet's
    seal key fingerprint (refused, exit 2, when these keys cannot open the fleet's values)."""
    from runq.serve.supervisor import refuse_a_foreign_seal_key
    from runq.store import open_store

    config = cli_ctx.config

    async def go() -> int:
        async with open_store(config) as store:
            applied = await store.migrate()
            await refuse_a_foreign_seal_key(store)
            return applied

    applied = run_async(go)
    click.echo(f"applied {applied} migration(s) to {redact_url(config.store.url)}")


@click.command("work")
@click.option("--limit", type=click.IntRange(min=1), default=SWEEP_LIMIT, show_default=True)
@click.option(
    "--time-limit",
    type=click.FloatRange(min=0),
    default=SWEEP_TIME_LIMIT_SECONDS,
    show_default=True,
)
@click.option("--create", is_flag=True, help="Create (and migrate) a missing SQLite database.")
@click.option("--json", "as_json", is_flag=True)
@common_options
def work_cmd(
    cli_ctx: CliContext, limit: int, time_limit: float, create: bool, as_json: bool
) -> None:
    """One bounded sweep for cron: oldest first. Exit 0 even when runs failed; 1 when the
    queue cannot be read."""
    from runq.store.replication import check_at_start
    from runq.worker.claimer import SweepReport, sweep
    from runq.worker.runtime import WorkerRuntime

    config = cli_ctx.config

    async def go() -> SweepReport:
        components = ComponentRegistry.from_config(config.components)
        try:
            async with cli_ctx.store(migrate=True, create=create) as store:
                await check_at_start(
                    store, required=config.store.require_synchronous_replication, announce=False
                )
                runtime = WorkerRuntime(store=store, config=config, components=components)
                return await sweep(
                    store,
                    runtime,
                    limit=limit,
                    time_limit=time_limit,
                    deployment_id=config.queue.deployment,
                    serialize_sessions=config.queue.serialize_sessions,
                )
        finally:
            with anyio.CancelScope(shield=True):
                await components.aclose()

    report = run_async(go)
    if as_json:
        echo_json(report.as_dict())
        return
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items())) or "none"
    click.echo(
        f"claimed {report.claimed} run(s) in {report.seconds:.2f}s ({outcomes}); "
        f"stopped: {report.stopped_by}"
    )


@click.command("reap")
@click.option(
    "--limit", type=int, default=REAP_LIMIT, show_default=True, help="At most this many (1-10000)."
)
@click.option("--json", "as_json", is_flag=True)
@common_options
def reap_cmd(cli_ctx: CliContext, limit: int, as_json: bool) -> None:
    """Settle running runs whose lease is stale: requeue or dead-letter."""
    if not 1 <= limit <= 10_000:
        click.echo(f"runq: --limit {limit} must be between 1 and 10000", err=True)
        sys.exit(EXIT_USAGE)
    from runq.maintenance.reaper import Reaper, ReaperConfig

    config = cli_ctx.config

    async def go() -> ReapReport:
        async with cli_ctx.store() as store:
            report = await Reaper(store, ReaperConfig.from_config(config, limit=limit)).run_once()
            if report.requeued:
                await wake_the_fleet(store)
            return report

    report = run_async(go)
    if as_json:
        echo_json(report)
        return
    click.echo(f"requeued: {report.requeued}")
    click.echo(f"dead-lettered: {report.dead_lettered}")
    click.echo(f"skipped: {report.skipped}")


@click.command("purge")
@click.option("--json", "as_json", is_flag=True)
@common_options
def purge_cmd(cli_ctx: CliContext, as_json: bool) -> None:
    """Delete final runs older than retention_seconds (what the daemon does hourly)."""
    from runq.maintenance.retention import Retention, RetentionConfig

    config = cli_ctx.config

    async def go() -> PurgeReport:
        async with cli_ctx.store() as store:
            return await Retention(store, RetentionConfig.from_config(config)).run_once()

    report = run_async(go)
    if as_json:
        echo_json(report)
    else:
        click.echo(f"deleted: {report.deleted}")


async def wake_the_fleet(store: Store) -> None:
    """After ``runq reap`` requeued runs: one wake-up on the store's channel, so the
    daemons claim them now rather than at their next poll (a failure is only logged)."""
    try:
        await store.notifications().send(WAKE_MESSAGE)
    except Exception as e:
        log.warning("notify.failed", error=str(e) or type(e).__name__)
