"""The claim statements (plain and under ``[limits]``) and the release of unstarted claims."""

from __future__ import annotations

from runq.limits import NO_CAP
from runq.store.postgres.statements.fragments import (
    ACTIVE_LIST,
    budget_allows,
    claimed_events,
    component_name,
    locked_in_id_order,
    still_running,
    unindexed,
)

#: The status test of a claim by id: the run is reached by its primary key, never by
#: walking the queued runs of an index (``unindexed``).
QUEUED_BY_ID = unindexed("r.status = 'queued'")


def _claim_filters(s: str, now: str, first: int) -> str:
    """The per-row claim rules shared by every claim variant.

    Parameters from ``$first``: serialize (bool), blocked users, blocked configurations,
    blocked pair users, blocked pair configurations (text[] each; empty = nothing blocked).
    The session rule probes runs_session_active_idx: a run waits while an older run of its
    session is not final, or any run of its session is running or paused.
    """
    ser = f"${first}"
    return f"""
        r.available_at <= {now}
        AND (NOT {ser}::bool OR r.session_id IS NULL OR NOT EXISTS (
            SELECT 1 FROM {s}.runs o
            WHERE o.session_id = r.session_id AND o.status IN ({ACTIVE_LIST})
              AND (o.id < r.id OR o.status <> 'queued')))
        AND {budget_allows(first + 1)}
        AND NOT EXISTS (
            SELECT 1 FROM {s}.pauses p
            WHERE (p.kind = 'deployment' AND p.target = r.deployment_id)
               OR (p.kind = 'component' AND {component_name("r")} LIKE p.like_pattern))"""


def _claim_update(s: str, now: str, candidates: str) -> str:
    """Take the lease on the locked candidate ids (CTE ``c``) and log each ``claimed``
    event; ``$1`` is the worker id.

    ``id = ANY(ARRAY(...))`` rather than a join: a prepared statement may run a generic
    plan, which cannot see ``LIMIT $2`` and guesses thousands of candidates; a join would
    then hash the whole table, while ``= ANY`` always probes the primary key.
    """
    return f"""
        WITH c AS MATERIALIZED ({candidates}),
        claimed AS (
            UPDATE {s}.runs AS u
            SET status = 'running', attempt = u.attempt + 1, locked_by = $1,
                locked_at = {now}, started_at = {now}, updated_at = {now},
                event_seq = u.event_seq + 1
            WHERE u.id = ANY(ARRAY(SELECT id FROM c))
            RETURNING u.*),
        logged AS ({claimed_events(s, "claimed")})
        SELECT * FROM claimed"""


def claim_sql(s: str, now: str) -> tuple[str, str, str]:
    """(no deployment, with a deployment, one run by id).

    Each branch walks runs_claim_idx for ONE deployment_id in claim order, so final rows
    (outside the partial index) and other deployments' rows are never read, and stops after
    ``slots`` rows it could lock. A worker with a deployment runs two such walks (no
    deployment, and its own) and keeps the first ``slots`` of at most 2 x ``slots``
    candidates; the extra rows stay locked only until this statement commits. An
    ``IN ('', $dep)`` walk would instead read every claimable row of both deployments
    and sort them (PostgreSQL 15 cannot keep index order across an IN list).
    """
    filters = _claim_filters(s, now, 3)

    def branch(columns: str, dep: str) -> str:
        return (
            f"SELECT {columns} FROM {s}.runs r "
            f"WHERE r.status = 'queued' AND r.deployment_id = {dep} AND {filters} "
            "ORDER BY r.priority, r.available_at, r.id LIMIT $2 FOR UPDATE SKIP LOCKED"
        )

    ordered = "r.id, r.priority, r.available_at"
    plain = branch("r.id", "''")
    merged = f"""
        SELECT m.id FROM (
            SELECT * FROM ({branch(ordered, "''")}) AS a
            UNION ALL
            SELECT * FROM ({branch(ordered, "$8")}) AS b
        ) AS m
        ORDER BY m.priority, m.available_at, m.id LIMIT $2"""
    one = f"""
        SELECT r.id FROM {s}.runs r
        WHERE r.id = $2 AND {QUEUED_BY_ID} AND r.deployment_id IN ('', $8) AND {filters}
        FOR UPDATE SKIP LOCKED"""
    return (
        _claim_update(s, now, plain),
        _claim_update(s, now, merged),
        _claim_update(s, now, one),
    )


def claim_head_sql(s: str, now: str) -> tuple[str, str]:
    """(the head of the queue, a claim from it), for a worker without a deployment.

    Every claim leaves its rows' old entries at the head of runs_claim_idx, where only
    VACUUM removes them, so a claim from the start walks every run claimed since the last
    vacuum (24 ms for 16 runs after 165,000 claims). The head query walks them once: the
    first due queued row in claim order. The claim from it takes, as the plain claim does,
    the first ``$2`` claimable rows in claim order, but starts priority ``$8``'s walk at
    (``$9`` available_at, ``$10`` id): rows of a lower priority number (branch a) and of a
    higher one (branch c) are walked whole. A row that enters the queue after the head was
    read sorts after it within its priority (it is due now or later), except a run given
    back unstarted (its ``available_at`` is kept): the caller reads the head again, and
    claims from the start, often enough to find those.
    """
    head = f"""
        SELECT r.priority, r.available_at, r.id FROM {s}.runs r
        WHERE r.status = 'queued' AND r.deployment_id = '' AND r.available_at <= {now}
        ORDER BY r.priority, r.available_at, r.id LIMIT 1"""
    filters = _claim_filters(s, now, 3)
    ordered = "r.id, r.priority, r.available_at"

    def branch(where: str) -> str:
        return (
            f"SELECT {ordered} FROM {s}.runs r "
            f"WHERE r.status = 'queued' AND r.deployment_id = '' AND {where} AND {filters} "
            "ORDER BY r.priority, r.available_at, r.id LIMIT $2 FOR UPDATE SKIP LOCKED"
        )

    lower = branch("r.priority < $8::int")
    same = branch("r.priority = $8::int AND (r.available_at, r.id) >= ($9::float8, $10::text)")
    higher = branch("r.priority > $8::int")
    merged = f"""
        SELECT m.id FROM (
            SELECT * FROM ({lower}) AS a
            UNION ALL SELECT * FROM ({same}) AS b
            UNION ALL SELECT * FROM ({higher}) AS c
        ) AS m
        ORDER BY m.priority, m.available_at, m.id LIMIT $2"""
    return head, _claim_update(s, now, merged)


def limited_claim_sql(s: str, now: str) -> tuple[str, str, str]:
    """The claim variants used while ``[limits]`` are configured: (no deployment, with a
    deployment, one run by id).

    Parameters as in ``claim_sql`` ($8 the deployment, '' when none), then $9 the limit
    patterns in LIKE form, most specific first, and $10 each pattern's room (runs it may
    still start); $11 each pattern's ``max_running_per_key`` and, for the keys running now,
    $12 group, $13 key, $14 running count. A run's group is the first pattern it matches.
    Runs of a group (or key) with no room are filtered inside the index walk, so they
    neither fill the LIMIT nor hold up the runs behind them; among the candidates, at most
    ``room`` per group and per key are taken. Callers hold the limits lock, so the room
    they computed cannot be spent by another claimer before this statement commits.
    """
    filters = _claim_filters(s, now, 3)
    group = f"""(SELECT p.i FROM unnest($9::text[]) WITH ORDINALITY AS p(pat, i)
               WHERE {component_name("r")} LIKE p.pat ORDER BY p.i LIMIT 1)"""
    key_room = f"""CASE WHEN r.concurrency_key IS NULL OR g.i IS NULL THEN {NO_CAP}
        ELSE ($11::int[])[g.i] - coalesce((
            SELECT k.n FROM unnest($12::int[], $13::text[], $14::int[]) AS k(g, key, n)
            WHERE k.g = g.i AND k.key = r.concurrency_key), 0) END"""
    has_room = f"coalesce(($10::int[])[g.i], 1) > 0 AND {key_room} > 0"
    columns = (
        f"r.id, r.priority, r.available_at, g.i AS grp, r.concurrency_key AS ckey,"
        f" {key_room} AS kroom"
    )

    def branch(dep: str) -> str:
        return (
            f"SELECT {columns} FROM {s}.runs r CROSS JOIN LATERAL (SELECT {group} AS i) g "
            f"WHERE r.status = 'queued' AND r.deployment_id = {dep} AND {filters} "
            f"AND {has_room} "
            "ORDER BY r.priority, r.available_at, r.id LIMIT $2 FOR UPDATE OF r SKIP LOCKED"
        )

    def capped(candidates: str) -> str:
        return f"""
        SELECT w.id FROM (
            SELECT m.*,
                row_number() OVER (
                    PARTITION BY m.grp ORDER BY m.priority, m.available_at, m.id) AS nth,
                row_number() OVER (
                    PARTITION BY m.grp, m.ckey ORDER BY m.priority, m.available_at, m.id) AS knth
            FROM ({candidates}) AS m
        ) AS w
        WHERE (w.grp IS NULL OR w.nth <= ($10::int[])[w.grp])
          AND (w.ckey IS NULL OR w.knth <= w.kroom)
        ORDER BY w.priority, w.available_at, w.id LIMIT $2"""

    no_dep, ours = branch("''"), branch("$8")
    # ``$8`` is named in every variant so the parameters keep one numbering.
    plain = capped(f"SELECT * FROM ({no_dep}) AS a WHERE $8::text IS NOT NULL")
    merged = capped(f"SELECT * FROM ({no_dep}) AS a UNION ALL SELECT * FROM ({ours}) AS b")
    one = capped(
        f"SELECT {columns} FROM {s}.runs r CROSS JOIN LATERAL (SELECT {group} AS i) g "
        f"WHERE r.id = $2 AND {QUEUED_BY_ID} AND r.deployment_id IN ('', $8) "
        f"AND {filters} AND {has_room} FOR UPDATE OF r SKIP LOCKED"
    ).replace("LIMIT $2", "LIMIT 1")
    return (
        _claim_update(s, now, plain),
        _claim_update(s, now, merged),
        _claim_update(s, now, one),
    )


def release_sql(s: str, now: str) -> str:
    """Give claimed runs back (fenced on the lease the claim took): queued again with the
    attempt restored, the reason recorded in ``error`` when not NULL. $1 worker, $2 ids,
    $3 attempts, $4 reasons. The rows are locked in id order first (lock order)."""
    mine = f"r.locked_by = $1 AND {still_running('r')}"
    return f"""
        WITH locked AS MATERIALIZED ({locked_in_id_order(s, "$2::text[]", mine)})
        UPDATE {s}.runs AS r SET
            status = 'queued', attempt = r.attempt - 1,
            started_at = CASE WHEN r.attempt = 1 THEN NULL ELSE r.started_at END,
            error = coalesce(v.reason, r.error), updated_at = {now},
            locked_by = NULL, locked_at = NULL
        FROM unnest($2::text[], $3::int[], $4::text[]) AS v(id, attempt, reason)
        WHERE r.id = v.id AND r.attempt = v.attempt AND r.locked_by = $1
          AND {still_running("r")} AND r.id = ANY(ARRAY(SELECT id FROM locked))"""


#: How starts are added to a pattern's window row (``w``, the stored row; ``EXCLUDED``, the
#: starts of one claim and its window): a later window starts over, and the row never goes
#: back to an earlier one (a claim whose clock is older than the row's window, which would
#: otherwise reset it and let the current window admit its cap twice).
RATE_WINDOW_ADD = """
                used = CASE WHEN w.window_start = EXCLUDED.window_start THEN w.used + EXCLUDED.used
                            WHEN w.window_start > EXCLUDED.window_start THEN w.used
                            ELSE EXCLUDED.used END,
                window_start = GREATEST(w.window_start, EXCLUDED.window_start)"""

#: The ``rate_windows`` row every one-statement limited claim bumps (no pattern is empty):
#: its ``used`` is a claim counter, so a claim can tell whether another committed between
#: its snapshot and its row lock. Wraps before INTEGER does.
EPOCH_ROW = ""
EPOCH_WRAP = 1_000_000_000


def admit_sql(s: str, now: str) -> tuple[str, str, str]:
    """The limited claim as ONE statement: (no deployment, with a deployment, one run by id).

    Parameters $1-$8 as in ``claim_sql`` ($8 the deployment, '' when none), then per limit
    group, most specific first: $9 patterns in LIKE form, $10 ``max_running``, $11
    ``max_running_per_key``, $12 rate starts per window (``NO_CAP`` where a kind is not
    capped), $13 rate periods in seconds, $14 the patterns as written (rate window keys).

    The statement counts running runs per group and key and reads the rate windows, claims
    within the room left, and adds its starts to the windows. Its counts come from the
    statement's snapshot, which another claimer may have outdated by committing before
    this one locks anything; so every such claim also bumps one counter row. The bump
    waits for a concurrent claimer's commit (a row lock) and then sees its bump: when the
    counter moved by more than this claim's own step, the snapshot is stale, nothing is
    claimed and ``fresh`` is false (the caller retries with a new snapshot). When it moved
    by exactly one, no limited claim committed since the snapshot and none can until this
    one does, so the counts were exact. Every row returned carries ``fresh``; one row with
    NULL run columns comes back when nothing was claimed.
    """
    filters = _claim_filters(s, now, 3)

    def group(alias: str) -> str:
        return f"""(SELECT p.i FROM unnest($9::text[]) WITH ORDINALITY AS p(pat, i)
               WHERE {component_name(alias)} LIKE p.pat ORDER BY p.i LIMIT 1)"""

    room = "(SELECT a FROM rooms)"
    key_room = f"""CASE WHEN r.concurrency_key IS NULL OR g.i IS NULL THEN {NO_CAP}
        ELSE ($11::int[])[g.i] - coalesce((
            SELECT b.n FROM busy b WHERE b.i = g.i AND b.ckey = r.concurrency_key), 0) END"""
    has_room = f"coalesce({room}[g.i], 1) > 0 AND {key_room} > 0"
    columns = (
        f"r.id, r.priority, r.available_at, g.i AS grp, r.concurrency_key AS ckey,"
        f" {key_room} AS kroom"
    )
    window = f"floor({now} / ($13::float8[])[{{i}}]) * ($13::float8[])[{{i}}]"

    def branch(dep: str) -> str:
        return (
            f"SELECT {columns} FROM {s}.runs r CROSS JOIN LATERAL (SELECT {group('r')} AS i) g "
            f"WHERE r.status = 'queued' AND r.deployment_id = {dep} AND {filters} "
            f"AND {has_room} "
            "ORDER BY r.priority, r.available_at, r.id LIMIT $2 FOR UPDATE OF r SKIP LOCKED"
        )

    def statement(candidates: str, limit: str) -> str:
        return f"""
        WITH seen AS MATERIALIZED (
            SELECT coalesce((SELECT used FROM {s}.rate_windows
                             WHERE pattern = '{EPOCH_ROW}'), 0) AS epoch),
        busy AS MATERIALIZED (
            SELECT g.i, r.concurrency_key AS ckey, count(*) AS n
            FROM {s}.runs r CROSS JOIN LATERAL (SELECT {group("r")} AS i) g
            WHERE r.status = 'running' AND g.i IS NOT NULL GROUP BY 1, 2),
        rooms AS MATERIALIZED (
            SELECT array_agg(least(
                ($10::int[])[p.i] - coalesce((SELECT sum(b.n) FROM busy b WHERE b.i = p.i), 0),
                ($12::int[])[p.i] - coalesce((
                    SELECT w.used FROM {s}.rate_windows w
                    WHERE w.pattern = p.pat AND w.window_start = {window.format(i="p.i")}), 0)
            ) ORDER BY p.i) AS a
            FROM unnest($14::text[]) WITH ORDINALITY AS p(pat, i)),
        bump AS (
            INSERT INTO {s}.rate_windows AS w (pattern, window_start, used)
            VALUES ('{EPOCH_ROW}', 0, 1)
            ON CONFLICT (pattern) DO UPDATE SET used = w.used % {EPOCH_WRAP} + 1
            RETURNING used),
        fresh AS MATERIALIZED (
            SELECT (SELECT used FROM bump) = (SELECT epoch FROM seen) % {EPOCH_WRAP} + 1 AS ok),
        c AS MATERIALIZED (
            SELECT w.id FROM (
                SELECT m.*,
                    row_number() OVER (
                        PARTITION BY m.grp ORDER BY m.priority, m.available_at, m.id) AS nth,
                    row_number() OVER (PARTITION BY m.grp, m.ckey
                                       ORDER BY m.priority, m.available_at, m.id) AS knth
                FROM ({candidates}) AS m
            ) AS w
            WHERE (w.grp IS NULL OR w.nth <= {room}[w.grp])
              AND (w.ckey IS NULL OR w.knth <= w.kroom)
            ORDER BY w.priority, w.available_at, w.id LIMIT {limit}),
        claimed AS (
            UPDATE {s}.runs AS u
            SET status = 'running', attempt = u.attempt + 1, locked_by = $1,
                locked_at = {now}, started_at = {now}, updated_at = {now},
                event_seq = u.event_seq + 1
            WHERE u.id = ANY(ARRAY(SELECT id FROM c)) AND (SELECT ok FROM fresh)
            RETURNING u.*),
        logged AS ({claimed_events(s, "claimed")}),
        rated AS (
            INSERT INTO {s}.rate_windows AS w (pattern, window_start, used)
            SELECT ($14::text[])[g.i], {window.format(i="g.i")}, count(*)
            FROM claimed r CROSS JOIN LATERAL (SELECT {group("r")} AS i) g
            WHERE ($12::int[])[g.i] < {NO_CAP} GROUP BY g.i
            ON CONFLICT (pattern) DO UPDATE SET {RATE_WINDOW_ADD})
        SELECT k.*, f.ok AS fresh FROM fresh f LEFT JOIN claimed k ON true"""

    no_dep, ours = branch("''"), branch("$8")
    # ``$8`` is named in every variant so the parameters keep one numbering.
    plain = statement(f"SELECT * FROM ({no_dep}) AS a WHERE $8::text IS NOT NULL", "$2")
    merged = statement(f"SELECT * FROM ({no_dep}) AS a UNION ALL SELECT * FROM ({ours}) AS b", "$2")
    one = statement(
        f"SELECT {columns} FROM {s}.runs r CROSS JOIN LATERAL (SELECT {group('r')} AS i) g "
        f"WHERE r.id = $2 AND {QUEUED_BY_ID} AND r.deployment_id IN ('', $8) "
        f"AND {filters} AND {has_room} FOR UPDATE OF r SKIP LOCKED",
        "1",
    )
    return plain, merged, one
