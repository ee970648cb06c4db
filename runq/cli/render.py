"""How runs and values are printed: JSON for ``--json``, rich tables for people."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click
import msgspec

from runq.model import JobView, Run, Status, WaitReason

if TYPE_CHECKING:
    from rich.console import Console


def echo_json(value: Any) -> None:
    click.echo(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())


def format_time(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


def new_console() -> Console:
    from rich.console import Console

    return Console(highlight=False)


def job_row(run: Run) -> list[str]:
    error = (run.error or "")[:60]
    return [
        run.id,
        run.component,
        run.status.value,
        f"{run.attempt}/{run.max_attempts}",
        format_time(run.created_at),
        error,
    ]


def print_run(run: Run, as_json: bool, *, waiting: WaitReason | None = None) -> None:
    if as_json:
        echo_json({**msgspec.to_builtins(run), "waiting": msgspec.to_builtins(waiting)})
        return
    from rich.table import Table

    table = Table(show_header=False)
    table.add_column("field")
    table.add_column("value")
    view = msgspec.to_builtins(JobView.from_run(run))
    view["answer"] = run.answer
    view["waiting"] = waiting.message if waiting is not None else None
    for key, value in view.items():
        if key.endswith("_at") and isinstance(value, int | float):
            value = f"{format_time(value)} ({value:.3f})"
        elif isinstance(value, dict | list):
            value = json.dumps(value)[:500]
        table.add_row(key, "-" if value is None else str(value))
    new_console().print(table)


def print_report(run: Run, as_json: bool) -> None:
    if as_json:
        echo_json(JobView.from_run(run))
        return
    extra = " (cancel requested)" if run.cancel_requested and run.status is Status.RUNNING else ""
    click.echo(f"{run.id} {run.status.value}{extra}")
