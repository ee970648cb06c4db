"""The claim statements, one per claim shape (limited, affinity, single run)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from runq.limits import NO_CAP
from runq.store.sqlite.statements.fragments import (
    ACTIVE_IN,
    BLOCKED_CONFIGURATION,
    BLOCKED_PAIR,
    BLOCKED_USER,
    COMPONENT,
)
from runq.store.statements import (
    sources_of,
    target_of,
)


@dataclass(frozen=True, slots=True)
class ClaimShape:
    """Which optional rules a claim statement carries; each shape is its own statement so
    the planner sees only the filters in use."""

    deployment: bool
    sessions: bool
    block_users: bool
    block_configurations: bool
    block_pairs: bool
    by_id: bool
    #: ``[limits]`` configured: group each run and take at most each group's room.
    limited: bool = False


#: A run's limit group: the first (most specific) of the ``:pats`` it matches. GLOB's ``*``
#: is the pattern's own wildcard and patterns hold no other GLOB character.
_GROUP = (
    "(SELECT CAST(p.key AS INTEGER) FROM json_each(:pats) p"
    f" WHERE {COMPONENT} GLOB p.value ORDER BY p.key LIMIT 1)"
)


def _room(group: str) -> str:
    return f"json_extract(:rooms, '$[' || {group} || ']')"


#: Runs the run's (group, concurrency key) may still start: ``:kmax`` holds each group's
#: ``max_running_per_key``, ``:krun`` the [group, key, running] of the keys running now.
_KEY_ROOM = (
    f"CASE WHEN r.concurrency_key IS NULL OR {_GROUP} IS NULL THEN {NO_CAP}"
    f" ELSE json_extract(:kmax, '$[' || {_GROUP} || ']') - coalesce(("
    "SELECT json_extract(k.value, '$[2]') FROM json_each(:krun) k"
    f" WHERE json_extract(k.value, '$[0]') = {_GROUP}"
    " AND json_extract(k.value, '$[1]') = r.concurrency_key), 0) END"
)


def _claim(t: str, shape: ClaimShape) -> str:
    pauses = t.removesuffix("_runs") + "_pauses"
    filters = [
        "r.status = 'queued'",
        "r.available_at <= :now",
        # Paused work is skipped by every claim at once; the table is tiny, usually empty.
        f"NOT EXISTS (SELECT 1 FROM {pauses} p"
        " WHERE (p.kind = 'deployment' AND p.target = r.deployment_id)"
        f" OR (p.kind = 'component' AND {COMPONENT} GLOB p.target))",
    ]
    if shape.limited:
        # A group with no room is filtered inside the walk, so its runs do not fill the
        # LIMIT and the runs behind them go on.
        filters.append(f"coalesce({_room(_GROUP)}, 1) > 0 AND {_KEY_ROOM} > 0")
    if shape.by_id:
        filters.append("r.id = :run_id")
    if shape.sessions:
        # The session rule in one probe of the active-session index: a run waits while
        # another active run of its session is older, or is running or paused.
        filters.append(
            f"(r.session_id IS NULL OR NOT EXISTS (SELECT 1 FROM {t} s"
            f" WHERE s.session_id = r.session_id AND s.{ACTIVE_IN} AND s.id <> r.id"
            " AND (s.id < r.id OR s.status <> 'queued')))"
        )
    if shape.block_users:
        filters.append(BLOCKED_USER)
    if shape.block_configurations:
        filters.append(BLOCKED_CONFIGURATION)
    if shape.block_pairs:
        filters.append(BLOCKED_PAIR)
    where = " AND ".join(filters)
    order = "ORDER BY r.priority, r.available_at, r.id LIMIT :slots"
    # Walk the claim index in claim order so LIMIT stops early; one run by id is a
    # primary-key lookup instead.
    walk = "" if shape.by_id else f" INDEXED BY {t}_claim_idx"

    group_column = (
        f", {_GROUP} AS grp, r.concurrency_key AS ckey, {_KEY_ROOM} AS kroom"
        if shape.limited
        else ""
    )

    def branch(dep: str) -> str:
        return (
            f"SELECT r.id, r.priority, r.available_at{group_column} FROM {t} r{walk}"
            f" WHERE r.deployment_id = {dep} AND {where} {order}"
        )

    no_dep = "''"
    if shape.deployment:
        # Two ordered index walks (no deployment, ours) merged, instead of one IN that
        # would sort every claimable row to find the first few.
        candidates = (
            f"SELECT id FROM (SELECT * FROM ({branch(no_dep)})"
            f" UNION ALL SELECT * FROM ({branch(':dep')}))"
            " ORDER BY priority, available_at, id LIMIT :slots"
        )
    else:
        candidates = f"SELECT id FROM ({branch(no_dep)})"
    if shape.limited:
        # At most ``room`` runs per group among the candidates. The claim runs under
        # BEGIN IMMEDIATE, so the room counted before it cannot be spent meanwhile.
        union = candidates.removeprefix("SELECT id FROM ").split(" ORDER BY priority")[0]
        candidates = (
            "SELECT id FROM (SELECT *, row_number() OVER (PARTITION BY grp"
            " ORDER BY priority, available_at, id) AS nth,"
            " row_number() OVER (PARTITION BY grp, ckey"
            f" ORDER BY priority, available_at, id) AS knth FROM {union})"
            f" WHERE (grp IS NULL OR nth <= {_room('grp')})"
            " AND (ckey IS NULL OR knth <= kroom)"
            " ORDER BY priority, available_at, id LIMIT :slots"
        )
    return (
        f"UPDATE {t} SET status = {target_of('claim')}, attempt = attempt + 1,"
        " locked_by = :worker, locked_at = :now, started_at = :now, updated_at = :now"
        # ``+status``: the recheck must not tempt the planner away from the id lookup.
        f" WHERE +status IN ({sources_of('claim')}) AND id IN ({candidates}) RETURNING *"
    )


def claims_sql(t: str) -> dict[ClaimShape, str]:
    return {
        shape: _claim(t, shape)
        for shape in itertools.starmap(ClaimShape, itertools.product((False, True), repeat=7))
    }
