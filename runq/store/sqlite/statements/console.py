"""The operator console's grouped reads on SQLite, built beside ``Statements``."""

from __future__ import annotations

from dataclasses import dataclass

from runq.store.sqlite.statements.fragments import FINAL_IN


@dataclass(frozen=True, slots=True)
class ConsoleStatements:
    """Reads of the console's overview and workers pages."""

    finished_per_minute: str
    running_by_worker: str


def build_console(schema: str) -> ConsoleStatements:
    t = f"{schema}_runs"
    return ConsoleStatements(
        # Final runs per (minute, status) since :since: a completed_at range of the final
        # index (named, as in purge: left alone the planner walks every final run through
        # the status index). Epoch seconds are positive, so the integer cast is the floor.
        finished_per_minute=(
            "SELECT CAST(completed_at / 60 AS INTEGER) * 60 AS minute, status, count(*)"
            f" FROM {t} INDEXED BY {t}_final_idx WHERE {FINAL_IN} AND completed_at >= :since"
            " GROUP BY minute, status"
        ),
        # Running runs per lease holder, through the lease index (status = 'running').
        running_by_worker=(
            f"SELECT locked_by, count(*) FROM {t}"
            " WHERE status = 'running' AND locked_by IS NOT NULL GROUP BY locked_by"
        ),
    )
