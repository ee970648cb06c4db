"""Flow-control statements: pauses, rate windows, running counts, usage and budgets."""

from __future__ import annotations

from runq.store.postgres.statements.claims import EPOCH_ROW, EPOCH_WRAP, RATE_WINDOW_ADD
from runq.store.postgres.statements.fragments import ACTIVE_LIST, budget_allows, component_name


def limits_sql(s: str, now: str) -> dict[str, str]:
    return {
        # The lock that serializes the claimers applying limits: each one counts the running
        # runs after the previous one committed, so none can over-admit. It is the claim
        # counter row the one-statement claim bumps, so that claim sees this one's commit
        # too (an advisory lock would be invisible to it).
        "limits_lock": f"""
            INSERT INTO {s}.rate_windows AS w (pattern, window_start, used)
            VALUES ('{EPOCH_ROW}', 0, 1)
            ON CONFLICT (pattern) DO UPDATE SET used = w.used % {EPOCH_WRAP} + 1""",
        # The clock rides along (a first row with no component), saving a round trip
        # inside the limits lock.
        # ``now`` is the transaction's start, which the claim stamps as ``started_at``;
        # ``clock`` is this statement's, after the lock: a claimer that waited for the lock
        # past the end of a rate window must not count its starts into the window gone.
        "running_by_component": (
            f"SELECT {now} AS now, {now} - extract(epoch from now())::float8"
            " + extract(epoch from statement_timestamp())::float8 AS clock,"
            " NULL::text AS component, NULL::text AS concurrency_key,"
            " 0::bigint AS n UNION ALL"
            f" SELECT NULL, NULL, {component_name('r')}, r.concurrency_key, count(*)"
            f" FROM {s}.runs r WHERE r.status = 'running' GROUP BY 3, 4"
        ),
        "rate_windows_get": (
            f"SELECT pattern, window_start, used FROM {s}.rate_windows"
            " WHERE pattern = ANY($1::text[])"
        ),
        # $1 patterns, $2 window starts, $3 starts to add; a new window starts over.
        "rate_windows_bump": f"""
            INSERT INTO {s}.rate_windows AS w (pattern, window_start, used)
            SELECT * FROM unnest($1::text[], $2::float8[], $3::int[])
            ON CONFLICT (pattern) DO UPDATE SET {RATE_WINDOW_ADD}""",
        # $1 id, $2 kind, $3 target, $4 LIKE form, $5 reason, $6 by. A second pause of the
        # same target returns the existing row.
        "pause_insert": f"""
            WITH ins AS (
                INSERT INTO {s}.pauses (id, kind, target, like_pattern, reason, created_by,
                                        created_at)
                VALUES ($1, $2, $3, $4, $5, $6, {now})
                ON CONFLICT (kind, target) DO NOTHING
                RETURNING *, true AS created
            )
            SELECT * FROM ins
            UNION ALL
            SELECT *, false AS created FROM {s}.pauses WHERE kind = $2 AND target = $3
              AND NOT EXISTS (SELECT 1 FROM ins)""",
        "pause_delete": f"DELETE FROM {s}.pauses WHERE id = $1 OR (kind = $2 AND target = $3)"
        " RETURNING *",
        "pause_list": f"SELECT * FROM {s}.pauses ORDER BY created_at, id",
        # The session rule for one run ($1 id, $2 session): an older active run of its
        # session, or one running or paused, holds it back.
        "session_ahead": f"""
            SELECT EXISTS (SELECT 1 FROM {s}.runs o
            WHERE o.session_id = $2 AND o.status IN ({ACTIVE_LIST}) AND o.id <> $1
              AND (o.id < $1 OR o.status <> 'queued'))""",
        # Queued runs per (component, deployment): ready now, delayed, and the ready ones
        # the budget excludes ($1-$4 as the claim's blocked parameters).
        "queued_by_component": f"""
            SELECT {component_name("r")} AS component, r.deployment_id,
                   count(*) FILTER (WHERE r.available_at <= {now}) AS ready,
                   count(*) FILTER (WHERE r.available_at > {now}) AS delayed,
                   count(*) FILTER (WHERE r.available_at <= {now} AND NOT ({budget_allows(1)}))
                       AS budget_held
            FROM {s}.runs r WHERE r.status = 'queued' GROUP BY 1, 2""",
    }


def usage_sql(s: str) -> dict[str, str]:
    # Counter rows are upserted in key order, so two writers of the same counters wait for
    # each other in one order (lock order).
    upsert = f"""
        INSERT INTO {s}.budget_usage AS b (scope, subject, period_start, cost, tokens, runs)
        SELECT k.scope, k.subject, k.period_start, {{cost}}, {{tokens}}, {{runs}}
        FROM unnest($1::text[], $2::text[], $3::float8[]) AS k(scope, subject, period_start)
        WHERE {{after}}
        ORDER BY k.scope, k.subject, k.period_start
        ON CONFLICT (scope, subject, period_start) DO UPDATE SET
            cost = b.cost + excluded.cost, tokens = b.tokens + excluded.tokens,
            runs = b.runs + excluded.runs"""
    return {
        # Unfenced on purpose: the money was spent whether or not the lease still holds.
        # The run row first, then the counters (lock order): the count over ``r`` is an
        # InitPlan of the insert's filter, so the UPDATE has run before the first upsert.
        "record_usage": f"""
            WITH r AS (
                UPDATE {s}.runs SET tokens = tokens + $4::bigint, cost = cost + $5::float8
                WHERE id = $6 RETURNING 1
            )
            {
            upsert.format(
                cost="$5::float8",
                tokens="$4::bigint",
                runs="0",
                after="(SELECT count(*) FROM r) >= 0",
            )
        }""",
        "count_claimed_run": upsert.format(cost="0", tokens="0", runs="1", after="true"),
        "usage_totals": f"""
            SELECT k.scope, k.subject, k.period_start, b.cost, b.tokens, b.runs
            FROM unnest($1::text[], $2::text[], $3::float8[]) AS k(scope, subject, period_start)
            JOIN {s}.budget_usage b USING (scope, subject, period_start)""",
        "usage_in_periods": f"""
            SELECT b.scope, b.subject, b.period_start, b.cost, b.tokens, b.runs
            FROM {s}.budget_usage b
            WHERE (b.scope, b.period_start) IN (
                SELECT * FROM unnest($1::text[], $2::float8[]))""",
    }
