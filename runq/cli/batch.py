"""``runq defer --from-file runs.jsonl``: many runs from a JSON-lines file, in batches.

Each non-blank line is one object ``{"component": "task/echo", "payload": ..., "options":
{...}}`` where ``options`` are ``Queue.new_run``'s (``session_id``, ``idempotency_key``,
``priority``, ``delay_seconds``, ``timeout_seconds``, ``unique_key``, ...). Every line is
checked before anything is stored: one bad line stores nothing and exit code 1 names each
bad line by number. The runs then go in batches of ``FILE_BATCH_RUNS`` through
``Queue.defer_many`` (each batch all or nothing); a batch the store refuses (a full queue)
stops there, exit 1, and the summary says how many lines were stored before it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import msgspec
from rich.progress import Progress

from runq.cli.options import CliContext, run_async
from runq.cli.render import echo_json
from runq.errors import RunqError
from runq.model import Actor, NewRun

if TYPE_CHECKING:
    from runq.queue import Queue

#: Runs per ``defer_many`` call: one transaction each, and progress moves per batch.
FILE_BATCH_RUNS = 1000
#: The ``options`` a line may give (``Queue.new_run``'s keywords a file may set).
LINE_OPTIONS = frozenset(
    {
        "session_id",
        "configuration",
        "idempotency_key",
        "max_attempts",
        "deployment_id",
        "priority",
        "delay_seconds",
        "unique_key",
        "unique_for_seconds",
        "unique_states",
        "concurrency_key",
        "timeout_seconds",
    }
)


class FileLine(msgspec.Struct, forbid_unknown_fields=True):
    component: str
    payload: Any = None
    options: dict[str, Any] = {}


@dataclass
class Summary:
    """What ``--json`` prints: lines read, runs stored (new and answered by a key), the
    bad lines (number and reason) and the line a refused batch started at."""

    file: str
    lines: int = 0
    created: int = 0
    existing: int = 0
    stored_lines: int = 0
    bad_lines: list[dict[str, Any]] = field(default_factory=list)
    refused: str | None = None

    @property
    def ok(self) -> bool:
        return not self.bad_lines and self.refused is None


def defer_from_file(cli_ctx: CliContext, path: str, actor: Actor, as_json: bool) -> None:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"cannot read {path}: {e}", param_hint="--from-file") from e
    summary = run_async(lambda: _defer_file(cli_ctx, Path(path), text, actor, as_json))
    if as_json:
        echo_json(summary.__dict__)
    else:
        _print_summary(summary)
    if not summary.ok:
        sys.exit(1)


async def _defer_file(
    cli_ctx: CliContext, path: Path, text: str, actor: Actor, as_json: bool
) -> Summary:
    summary = Summary(file=str(path))
    async with cli_ctx.queue(migrate=True, components=True, create=True) as q:
        numbered: list[tuple[int, NewRun]] = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            summary.lines += 1
            try:
                numbered.append((number, _new_run(q, line, actor)))
            except (ValueError, TypeError, msgspec.ValidationError, RunqError) as e:
                summary.bad_lines.append({"line": number, "error": str(e)})
        if summary.bad_lines:
            return summary
        # A progress bar only for a person watching: scripts and pipes get none.
        show = sys.stderr.isatty() and not as_json
        with Progress(disable=not show, transient=True) as progress:
            task = progress.add_task(f"deferring {path.name}", total=len(numbered))
            for start in range(0, len(numbered), FILE_BATCH_RUNS):
                chunk = numbered[start : start + FILE_BATCH_RUNS]
                try:
                    results = await q.defer_many([new for _, new in chunk])
                except RunqError as e:
                    summary.refused = f"line {chunk[0][0]} onwards: {e}"
                    return summary
                summary.created += sum(r.created for r in results)
                summary.existing += sum(not r.created for r in results)
                summary.stored_lines += len(chunk)
                progress.advance(task, len(chunk))
    return summary


def _new_run(q: Queue, line: str, actor: Actor) -> NewRun:
    parsed = msgspec.convert(_object(json.loads(line)), FileLine)
    unknown = sorted(set(parsed.options) - LINE_OPTIONS)
    if unknown:
        raise ValueError(f"unknown options {unknown}; known: {sorted(LINE_OPTIONS)}")
    ctype, sep, cid = parsed.component.partition("/")
    if not sep:
        raise ValueError(f"component {parsed.component!r} is not TYPE/ID, e.g. task/echo")
    new: NewRun = q.new_run(ctype, cid, parsed.payload, actor=actor, origin="cli", **parsed.options)
    return new


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("each line must be a JSON object")
    return value


def _print_summary(summary: Summary) -> None:
    for bad in summary.bad_lines:
        click.echo(f"{summary.file}:{bad['line']}: {bad['error']}", err=True)
    if summary.bad_lines:
        click.echo(f"{len(summary.bad_lines)} bad line(s); nothing was stored", err=True)
        return
    stored = f"{summary.created} new run(s), {summary.existing} already stored"
    click.echo(f"{summary.stored_lines} of {summary.lines} line(s) stored: {stored}")
    if summary.refused is not None:
        click.echo(f"refused at {summary.refused}", err=True)


__all__ = ["defer_from_file"]
