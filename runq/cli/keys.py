"""``runq keys``: generate a seal key, or re-seal every run under the first key."""

from __future__ import annotations

import time

import click

from runq.cli.options import CliContext, common_options, run_async


@click.group("keys")
def keys() -> None:
    """Seal keys: generate one, or re-seal every run under the first key."""


@keys.command("generate")
@common_options
def keys_generate(cli_ctx: CliContext) -> None:
    """Print a new random key (urlsafe base64 of 32 bytes) for seal.keys."""
    from runq.seal import generate_key

    click.echo(generate_key())


@keys.command("rotate")
@click.option("--page-size", type=click.IntRange(1, 10_000), default=500, show_default=True)
@click.option("--after", "after_id", default="", help="Resume after this run id.")
@common_options
def keys_rotate(cli_ctx: CliContext, page_size: int, after_id: str) -> None:
    """Re-seal payload, answer and resume state of every run under the first key of
    seal.keys (keep the old keys listed until this finished). Safe to run again, and
    resumable with --after."""
    from rich.progress import Progress

    from runq.maintenance.rotation import KeyRotation, RotationReport
    from runq.store import open_store

    config = cli_ctx.config

    async def go() -> tuple[int, int, str]:
        last = after_id
        async with open_store(config) as store:
            total = await store.count_runs()
            with Progress(transient=False) as progress:
                task = progress.add_task("re-sealing", total=total or None)

                def on_page(report: RotationReport) -> None:
                    nonlocal last
                    last = report.last_id
                    scanned = min(report.runs_scanned, total) if total else report.runs_scanned
                    progress.update(task, completed=scanned)

                try:
                    report = await KeyRotation(store, page_size=page_size).run(
                        after_id=after_id, on_page=on_page
                    )
                except BaseException:
                    if last:
                        click.echo(f"interrupted; resume with --after {last}", err=True)
                    raise
                progress.update(task, completed=total)
        scanned = min(report.runs_scanned, total) if total else report.runs_scanned
        return scanned, report.resealed, report.last_id

    started = time.monotonic()
    runs, values, last = run_async(go)
    click.echo(
        f"re-sealed {values} value(s), about {runs} run(s) scanned, "
        f"in {time.monotonic() - started:.1f}s" + (f"; last id {last}" if last else "")
    )
