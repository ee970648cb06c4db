"""The operator console's grouped reads on PostgreSQL, built beside ``Statements``."""

from __future__ import annotations

from dataclasses import dataclass

from runq.store.postgres.statements.fragments import FINAL_LIST, clock_expr


@dataclass(frozen=True, slots=True)
class ConsoleStatements:
    """Reads of the console's overview and workers pages."""

    finished_per_minute: str
    running_by_worker: str


def build_console(schema: str, offset: float) -> ConsoleStatements:
    s, now = schema, clock_expr(offset)
    return ConsoleStatements(
        # $1 window seconds. Final runs per (minute, status) over the window, read through
        # runs_final_idx (its predicate, completed_at range); the one-row clock side makes
        # the database clock come back even when nothing finished.
        finished_per_minute=f"""
            SELECT c.db_now, g.minute, g.status, g.n
            FROM (SELECT {now} AS db_now) AS c
            LEFT JOIN (
                SELECT floor(completed_at / 60) * 60 AS minute, status, count(*) AS n
                FROM {s}.runs
                WHERE status IN ({FINAL_LIST}) AND completed_at >= {now} - $1::float8
                GROUP BY 1, 2
            ) AS g ON true""",
        # Running runs per lease holder, through runs_lease_idx (status = 'running').
        running_by_worker=f"""
            SELECT locked_by, count(*) AS n FROM {s}.runs
            WHERE status = 'running' AND locked_by IS NOT NULL
            GROUP BY locked_by""",
    )
