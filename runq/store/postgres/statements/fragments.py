"""SQL fragments several PostgreSQL statement groups share."""

from __future__ import annotations

from runq.model import ACTIVE_STATUSES, FINAL_STATUSES
from runq.store.statements import fenced, status_list

FINAL_LIST = status_list(FINAL_STATUSES)

ACTIVE_LIST = status_list(ACTIVE_STATUSES)  # must imply runs_session_active_idx's predicate

RUNNING_STATUS = "'running'"


def unindexed(condition: str) -> str:
    """``condition`` written so no index can serve it (nor imply a partial index's
    predicate): ``IS TRUE`` is the same test on NOT NULL columns but is no index qual.

    A statement that names its row by primary key must reach it through the primary key.
    Left as a plain comparison, a status test offers the planner runs_status_created_idx
    (and the partial indexes keyed on a status), which walk every run of that status; on
    an empty table, where a cached generic plan may be made, every path costs the same and
    the planner may take that walk for the life of the connection.
    """
    return f"({condition}) IS TRUE"


def still_running(alias: str = "") -> str:
    """The ``status = 'running'`` part of a fence, written so no index can serve it
    (``unindexed``): a fenced write is always a primary key probe."""
    p = f"{alias}." if alias else ""
    return unindexed(f"{p}status = 'running'")


def locked_in_id_order(s: str, ids: str, where: str, *, skip_locked: bool = False) -> str:
    """The ids of ``ids`` (a text[] expression) whose rows pass ``where`` (over alias
    ``r``), row-locked in id order: the one order every runq statement that waits for
    several run rows takes them in, so two of them never wait for each other crosswise
    (see docs/INTERNALS.md, "Lock order"). The rows are probed by primary key, and the
    locks are taken by the sort's consumer, so in id order whatever order the probes
    return. FOR UPDATE rechecks ``where`` on the newest version of a row changed since
    the statement's snapshot. ``skip_locked``: a row another transaction holds is left
    out instead of waited for (who never waits takes no part in a cycle).

    Meant as a MATERIALIZED CTE the write then names with ``id = ANY(ARRAY(SELECT id FROM
    ...))``: an InitPlan, so every lock is taken before the write touches its first row.
    """
    skip = " SKIP LOCKED" if skip_locked else ""
    return f"""
            SELECT r.id FROM {s}.runs r
            WHERE r.id = ANY({ids}) AND {where}
            ORDER BY r.id FOR NO KEY UPDATE OF r{skip}"""


def clock_expr(offset: float) -> str:
    # A float literal keeps the text stable for a given offset (the offset is 0 outside
    # tests), so the statement stays prepared; repr() round-trips the exact value.
    return f"(extract(epoch from now())::float8 + ({float(offset)!r})::float8)"


def component_name(alias: str) -> str:
    return f"({alias}.component_type || '/' || {alias}.component_id)"


def fenced_where(verb: str, alias: str = "") -> str:
    """The lease fence of a worker's single-lease write: $1 id, $2 attempt, $3 worker.
    A write fenced on the exact attempt and holder cannot land on a run that was reaped
    and claimed again by someone else meanwhile."""
    fenced(verb)
    p = f"{alias}." if alias else ""
    return f"{p}id = $1 AND {p}attempt = $2 AND {p}locked_by = $3 AND {still_running(alias)}"


def budget_allows(first: int) -> str:
    """The budget rule of the claim (true when the run is not blocked): parameters from
    ``$first`` are the blocked users, configurations, pair users and pair configurations
    (text[] each; empty = none). Also counts the held runs for the exporter."""
    users, confs, pu, pc = (f"${first + i}" for i in range(4))
    return f"""(coalesce(r.user_id, '') <> ALL({users}::text[])
        AND coalesce(r.configuration, '') <> ALL({confs}::text[])
        AND NOT EXISTS (
            SELECT 1 FROM unnest({pu}::text[], {pc}::text[]) AS b(u, c)
            WHERE b.u = coalesce(r.user_id, '') AND b.c = coalesce(r.configuration, '')))"""


def claimed_events(s: str, claimed: str) -> str:
    """The ``claimed`` events of the runs the CTE ``claimed`` took, one INSERT for the batch.

    A claim moves ``event_seq`` itself, which keeps the transition trigger (migration 0014)
    out of it: one set-based insert here instead of a trigger call per run."""
    return f"""INSERT INTO {s}.run_events (run_id, seq, attempt, at, kind, info)
            SELECT id, event_seq, attempt, updated_at, 'claimed',
                   jsonb_build_object('attempt', attempt, 'worker', locked_by)
            FROM {claimed}"""


def completed_events(s: str, done: str) -> str:
    """The ``completed`` events of the runs the CTE ``done`` (a completion returning id,
    event_seq, attempt, updated_at, termination_reason and error) completed."""
    return f"""INSERT INTO {s}.run_events (run_id, seq, attempt, at, kind, info)
            SELECT id, event_seq, attempt, updated_at, 'completed',
                   jsonb_build_object('termination_reason', termination_reason, 'error', error)
            FROM {done}"""


def channel_name(schema: str) -> str:
    """The installation's NOTIFY channel (one per schema); migration 0004's trigger spells
    the same name."""
    return f"runq_{schema}"


def completed_ids(s: str, done: str) -> str:
    """The ids a completion applied to, each announced on the installation's channel as
    the transition trigger announced a final event (followers on any replica wake)."""
    return f"""SELECT d.id, pg_notify('{channel_name(s)}', 'event:' || d.id || ':' || d.event_seq)
            FROM {done} d"""
