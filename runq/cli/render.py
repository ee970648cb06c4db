"""How runs and values are printed: JSON for ``--json``, rich tables for people."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click
import msgspec

from runq.model import Run, Status, WaitReason
from runq.ops.views import OPERATOR_VIEW, RunView

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

# Every C0 and C1 control character, DEL, and the bidirectional overrides and isolates: a run
# error or payload is text from outside, and an escape sequence in it (OSC 52 writes the
# clipboard, others retitle or redraw the terminal) or a bidi override (text that reads
# differently than it is) must never reach the operator's terminal. Tab and newline become a
# space so a table row stays one row. One ``str.translate`` pass: linear in the text.
_CONTROL: dict[int, str | None] = {c: None for c in (*range(0x00, 0x20), *range(0x7F, 0xA0))}
_CONTROL.update({c: None for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))})
_CONTROL.update({ord("\t"): " ", ord("\n"): " ", ord("\r"): " "})


def printable(value: str) -> str:
    """``value`` without control characters, safe to write to a terminal."""
    return value.translate(_CONTROL)


def cell(value: str) -> Text:
    """A table cell that rich prints literally: control characters stripped and no markup
    parsed, so ``[/]`` or ``[link=...]`` in a run error is shown, not interpreted."""
    from rich.text import Text

    return Text(printable(value))


def echo_json(value: Any) -> None:
    click.echo(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())


def format_time(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


def new_console() -> Console:
    from rich.console import Console

    return Console(highlight=False)


def job_row(run: Run) -> list[Text]:
    error = (run.error or "")[:60]
    texts = [
        run.id,
        run.component,
        run.status.value,
        f"{run.attempt}/{run.max_attempts}",
        format_time(run.created_at),
        error,
    ]
    return [cell(text) for text in texts]


def _with_pause_summary(view: dict[str, Any], summary: str | None) -> dict[str, Any]:
    """The view with the pause summary right after the pause reason: what an approver is
    asked to decide, text from the handler (printed through ``cell`` like any other)."""
    out: dict[str, Any] = {}
    for key, value in view.items():
        out[key] = value
        if key == "pause_reason":
            out["pause_summary"] = summary
    return out


def print_run(
    run: Run,
    as_json: bool,
    *,
    waiting: WaitReason | None = None,
    error_detail: str | None = None,
) -> None:
    if as_json:
        body = msgspec.to_builtins(run)
        echo_json({**body, "waiting": msgspec.to_builtins(waiting), "error_detail": error_detail})
        return
    from rich.table import Table

    table = Table(show_header=False)
    table.add_column("field")
    table.add_column("value")
    view = _with_pause_summary(
        msgspec.to_builtins(RunView.of(run, OPERATOR_VIEW)), run.pause_summary
    )
    view["answer"] = run.answer
    view["waiting"] = waiting.message if waiting is not None else None
    view["error_detail"] = error_detail
    for key, value in view.items():
        if key.endswith("_at") and isinstance(value, int | float):
            value = f"{format_time(value)} ({value:.3f})"
        elif isinstance(value, dict | list):
            value = json.dumps(value)[:500]
        table.add_row(cell(key), cell("-" if value is None else str(value)))
    new_console().print(table)


def print_report(run: Run, as_json: bool) -> None:
    if as_json:
        echo_json(RunView.of(run, OPERATOR_VIEW))
        return
    extra = " (cancel requested)" if run.cancel_requested and run.status is Status.RUNNING else ""
    click.echo(printable(f"{run.id} {run.status.value}{extra}"))
