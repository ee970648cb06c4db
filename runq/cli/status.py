"""``runq status``: queue health for people, scripts and monitoring checks."""

from __future__ import annotations

import sys
import traceback

import click
import msgspec

from runq.cli.options import (
    EXIT_UNHEALTHY,
    EXIT_USAGE,
    CliContext,
    common_options,
    first_error,
    leaf_errors,
    run_async,
)
from runq.cli.pauses import print_pauses
from runq.cli.render import cell, echo_json, new_console, printable
from runq.errors import ConfigError
from runq.model import Pause, QueueHealth, SettingDivergence, Status
from runq.store.replication import ReplicationMode, ReplicationReport


def _problems(
    health: QueueHealth,
    divergences: list[SettingDivergence],
    *,
    max_queue_wait: float,
    minimum_workers: int,
) -> list[str]:
    problems = []
    if health.expired_leases:
        problems.append(f"{health.expired_leases} running run(s) have an expired lease")
    age = health.oldest_queued_age_seconds
    if age is not None and age > max_queue_wait:
        problems.append(f"the oldest queued run has waited {age:.0f}s (> {max_queue_wait:g}s)")
    if health.live_workers < minimum_workers:
        problems.append(f"{health.live_workers} live worker(s) (< {minimum_workers})")
    # A fleet-wide setting the live workers disagree on acts on each other's runs (a
    # shorter lock grace reaps a peer's live leases): unhealthy until rolled out alike.
    problems.extend(d.describe() for d in divergences)
    return problems


def _replication_problems(replication: ReplicationReport, *, required: bool) -> list[str]:
    """``require_synchronous_replication`` promises what the database must keep: a replica
    refuses to start without it, and one already running after a failover to a primary
    that replicates asynchronously (or not at all) is unhealthy until it does again."""
    if not required or replication.mode is ReplicationMode.SYNCHRONOUS:
        return []
    return [
        f"the database replicates {replication.mode.value}, but"
        " store.require_synchronous_replication is set: an acknowledged run could be lost"
        " in a failover"
    ]


def _warnings(
    health: QueueHealth, replication: ReplicationReport, *, max_transaction_age: float
) -> list[str]:
    """Not unhealthy yet, but getting there: a transaction held open pins the vacuum
    horizon, so dead row versions pile up in the claim index and every claim walks them;
    synchronous commits with no synchronous standby connected wait for one."""
    warnings = []
    age = health.oldest_transaction_age_seconds
    if age is not None and age > max_transaction_age:
        warnings.append(
            f"a database transaction (pid {health.oldest_transaction_pid}) has been open"
            f" {age:.0f}s (> {max_transaction_age:g}s): vacuum cannot remove dead rows"
            " meanwhile"
        )
    if (
        replication.mode is ReplicationMode.SYNCHRONOUS
        and replication.standbys_visible
        and not replication.synchronous_standbys
    ):
        warnings.append(
            "synchronous_standby_names is set but no synchronous standby is connected:"
            " every commit waits until one is"
        )
    return warnings


def _replication_rows(replication: ReplicationReport) -> list[tuple[str, str]]:
    rows = [("database", replication.server or "-"), ("replication", replication.mode.value)]
    if replication.synchronous_standby_names:
        rows.append(("  synchronous_standby_names", replication.synchronous_standby_names))
    if replication.synchronous_commit:
        rows.append(("  synchronous_commit", replication.synchronous_commit))
    for standby in replication.standbys:
        state = " ".join(filter(None, (standby.state, standby.sync_state))) or "(hidden)"
        rows.append((f"  standby {standby.name}", state))
    return rows


def _print_status(
    health: QueueHealth,
    replication: ReplicationReport,
    problems: list[str],
    warnings: list[str],
) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="runq status", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    for status in Status:
        table.add_row(status.value, str(health.counts.get(status.value, 0)))
    age = health.oldest_queued_age_seconds
    table.add_row("oldest queued wait", "-" if age is None else f"{age:.1f}s")
    for deployment, dep_age in sorted(health.oldest_queued_age_by_deployment.items()):
        table.add_row(cell(f"  deployment {deployment or '(none)'}"), f"{dep_age:.1f}s")
    table.add_row("expired leases", str(health.expired_leases))
    table.add_row("live workers", str(health.live_workers))
    xact = health.oldest_transaction_age_seconds
    if xact is not None:
        table.add_row("oldest other transaction", f"{xact:.1f}s")
    for what, value in _replication_rows(replication):
        table.add_row(cell(what), cell(value))
    console = new_console()
    console.print(table)
    console.print(f"guarantee: {escape(printable(replication.guarantee))}")
    for warning in warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(printable(warning))}")
    if problems:
        for problem in problems:
            console.print(f"[red]unhealthy:[/red] {escape(printable(problem))}")
    else:
        console.print("[green]healthy[/green]")


Read = tuple[QueueHealth, ReplicationReport, list[Pause], list[SettingDivergence]]


@click.command("status")
@click.option("--json", "as_json", is_flag=True)
@click.option("--max-queue-wait", type=float, default=300.0, show_default=True)
@click.option("--minimum-workers", type=int, default=1, show_default=True)
@click.option(
    "--worker-max-age",
    type=float,
    default=None,
    help="A worker seen within this many seconds is live [default: 3 heartbeat intervals].",
)
@click.option(
    "--max-transaction-age",
    type=float,
    default=None,
    help="PostgreSQL: warn when another transaction has been open longer than this many"
    " seconds [default: queue.lock_grace_seconds]. A warning does not change the exit code.",
)
@common_options
def status_cmd(
    cli_ctx: CliContext,
    as_json: bool,
    max_queue_wait: float,
    minimum_workers: int,
    worker_max_age: float | None,
    max_transaction_age: float | None,
) -> None:
    """Queue health. Exit 0 healthy, 1 unhealthy or database unreadable, 2 bad arguments."""
    bad = []
    if max_queue_wait < 0:
        bad.append("--max-queue-wait must be >= 0")
    if minimum_workers < 0:
        bad.append("--minimum-workers must be >= 0")
    if worker_max_age is not None and worker_max_age <= 0:
        bad.append("--worker-max-age must be > 0")
    if max_transaction_age is not None and max_transaction_age < 0:
        bad.append("--max-transaction-age must be >= 0")
    if bad:
        click.echo("runq: " + "; ".join(bad), err=True)
        sys.exit(EXIT_USAGE)
    lock_grace = cli_ctx.config.queue.lock_grace_seconds
    xact_limit = lock_grace if max_transaction_age is None else max_transaction_age
    live_within = worker_max_age or cli_ctx.config.queue.live_worker_seconds

    async def go() -> Read:
        async with cli_ctx.operations() as ops:
            result = await ops.health(
                lock_grace_seconds=lock_grace, worker_max_age_seconds=live_within
            )
            replication = await ops.replication()
            return result, replication, await ops.list_pauses(), await ops.divergences(live_within)

    try:
        health, replication, pauses, divergences = run_async(go)
    except BaseException as e:
        if first_error(e, ConfigError) is not None or isinstance(e, KeyboardInterrupt):
            raise
        # Any failure to read is "unhealthy", with one line saying why.
        leaf = next(leaf_errors(e))
        if cli_ctx.debug:
            traceback.print_exception(e)
        click.echo(f"runq: database unreadable: {leaf}", err=True)
        sys.exit(EXIT_UNHEALTHY)
    problems = _problems(
        health, divergences, max_queue_wait=max_queue_wait, minimum_workers=minimum_workers
    )
    problems += _replication_problems(
        replication, required=cli_ctx.config.store.require_synchronous_replication
    )
    warnings = _warnings(health, replication, max_transaction_age=xact_limit)
    if as_json:
        body = msgspec.to_builtins(health)
        echo_json(
            {
                "healthy": not problems,
                "problems": problems,
                "warnings": warnings,
                **body,
                "database": {
                    **msgspec.to_builtins(replication),
                    "guarantee": replication.guarantee,
                },
                "pauses": msgspec.to_builtins(pauses),
                "fleet_divergences": msgspec.to_builtins(divergences),
            }
        )
    else:
        _print_status(health, replication, problems, warnings)
        print_pauses(pauses)
    sys.exit(EXIT_UNHEALTHY if problems else 0)
