"""``runq ...``: the command line.

Every command takes ``--config FILE`` (also ``RUNQ_CONFIG``), ``--store-url`` (also
``RUNQ_STORE_URL``), ``--debug`` and ``--log-format``, before or after its name. A
configuration error prints one line naming the key and exits 2; an unreachable database
prints one line and exits 1; a traceback appears only with ``--debug``.

One module per concern: ``options`` (global options, errors, exit codes), ``render``
(printing), ``serve`` (serve, migrate, work, reap, purge), ``submit`` (enqueue, defer),
``status``, ``jobs`` (run ids: ``ids``), ``keys`` and ``schedules``.
"""

from __future__ import annotations

import functools

import click

from runq.cli.jobs import jobs
from runq.cli.keys import keys
from runq.cli.options import GlobalOptions, shared_options
from runq.cli.pauses import pause_cmd, pauses_cmd, resume_cmd
from runq.cli.schedules import schedules
from runq.cli.serve import migrate_cmd, purge_cmd, reap_cmd, serve_cmd, work_cmd
from runq.cli.status import status_cmd
from runq.cli.submit import defer_cmd, enqueue_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="runq")
@functools.partial(shared_options, on_group=True)
@click.pass_context
def cli(
    ctx: click.Context,
    config_path: str | None,
    store_url: str | None,
    debug: bool,
    log_format: str | None,
) -> None:
    """runq: a durable queue for background runs.

    --config, --store-url, --debug and --log-format go before or after the command's
    name: `runq --config runq.toml status` is `runq status --config runq.toml`.
    """
    ctx.obj = GlobalOptions(config_path, store_url, debug, log_format)


for command in (
    serve_cmd,
    migrate_cmd,
    enqueue_cmd,
    defer_cmd,
    work_cmd,
    reap_cmd,
    purge_cmd,
    status_cmd,
    jobs,
    keys,
    schedules,
    pause_cmd,
    resume_cmd,
    pauses_cmd,
):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="runq")


__all__ = ["cli", "main"]
