"""Operator statements: workers, stats, reaping, purging, resealing, job lists."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runq.store.listing_sql import ListingDialect
from runq.store.postgres.statements.fragments import (
    FINAL_LIST,
    completed_events,
    completed_ids,
    fenced_where,
    locked_in_id_order,
    still_running,
)
from runq.store.statements import (
    reap_exhausted_error,
    target_of,
)

if TYPE_CHECKING:  # the package builds Statements from this module's pieces
    from runq.store.postgres.statements import Statements


#: The client transaction of this database that has been open longest among those holding
#: back the vacuum horizon (a snapshot, ``backend_xmin``, or a transaction id,
#: ``backend_xid``: an idle-in-transaction session that wrote holds only the latter), other
#: than the reading one. Dead row versions deleted after it started cannot be removed, so
#: the claim index's dead head grows while it stays open. Sessions of other roles show
#: only to a role with pg_read_all_stats (or pg_monitor); replication slots and prepared
#: transactions are not counted.
_OLDEST_TRANSACTION = """
    SELECT extract(epoch from now() - xact_start)::float8 AS age, pid
    FROM pg_stat_activity
    WHERE datname = current_database() AND backend_type = 'client backend'
      AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
      AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
    ORDER BY xact_start LIMIT 1"""


def reap_sql(s: str, now: str) -> str:
    """The reaper's rules as one statement.

    ``cand`` scans stale leases oldest first; ``locked`` locks them with SKIP LOCKED and
    re-checks staleness on the newest row version (a lease renewed meanwhile, or a run
    another reaper settled, drops out and counts as skipped); the UPDATE applies the rules
    in order with CASE. $1 grace seconds, $2 limit, $3/$4 the texts of rules 1 and 2.
    Rows are addressed with ``id = ANY(ARRAY(...))`` so even a generic plan probes the
    primary key (see ``_claim_update``); the rule-3 text is an SQL expression over the
    row's own id, attempt and max_attempts.
    """
    stale = f"status = 'running' AND locked_at < {now} - $1::float8"
    dead = "(u.non_idempotent OR NOT u.has_request OR u.attempt >= u.max_attempts)"
    return f"""
        WITH cand AS MATERIALIZED (
            SELECT id, attempt FROM {s}.runs WHERE {stale}
            ORDER BY locked_at, id LIMIT $2
        ),
        locked AS MATERIALIZED (
            SELECT r.id FROM {s}.runs r
            WHERE r.id = ANY(ARRAY(SELECT id FROM cand))
              AND {still_running("r")} AND r.locked_at < {now} - $1::float8
              AND r.attempt = (SELECT c.attempt FROM cand c WHERE c.id = r.id)
            FOR UPDATE OF r SKIP LOCKED
        ),
        upd AS (
            UPDATE {s}.runs AS u SET
                status = CASE WHEN {dead} THEN 'failed' ELSE 'queued' END,
                termination_reason = CASE
                    WHEN u.non_idempotent OR NOT u.has_request THEN 'not_retryable'
                    WHEN u.attempt >= u.max_attempts THEN 'retries_exhausted'
                    ELSE NULL END,
                error = CASE
                    WHEN u.non_idempotent THEN $3::text
                    WHEN NOT u.has_request THEN $4::text
                    WHEN u.attempt >= u.max_attempts THEN {reap_exhausted_error()}
                    ELSE u.error END,
                completed_at = CASE WHEN {dead} THEN {now} ELSE NULL END,
                available_at = CASE WHEN {dead} THEN u.available_at ELSE {now} END,
                resume_state = CASE WHEN {dead} THEN NULL ELSE u.resume_state END,
                decision = CASE WHEN {dead} THEN NULL ELSE u.decision END,
                locked_by = NULL, locked_at = NULL, updated_at = {now}
            WHERE u.id = ANY(ARRAY(SELECT id FROM locked))
            RETURNING u.id, u.status
        )
        SELECT (SELECT count(*) FROM cand) AS seen,
               ARRAY(SELECT id FROM upd WHERE status = 'queued' ORDER BY id) AS requeued,
               ARRAY(SELECT id FROM upd WHERE status = 'failed' ORDER BY id) AS dead"""


def complete_update(s: str, now: str, *, numbered: bool = False) -> str:
    """The fenced completion of a batch: $1 worker, $2.. ids, attempts, sealed answers,
    termination reasons. Meant as the CTE ``done`` of ``completion``, which logs the
    ``completed`` events; it returns what they need. ``numbered``: $6 each run's expected
    ``event_seq`` and $7 how many events it carries; a run carrying events completes only at
    that ``event_seq`` and moves it past them and its ``completed`` event. Moving
    ``event_seq`` keeps the transition trigger out (migration 0014). The rows are those
    ``completion`` locked in id order (CTE ``locked``)."""
    seq_set, seq_columns, seq_types, seq_check = "event_seq = r.event_seq + 1", "", "", ""
    if numbered:
        seq_set = "event_seq = r.event_seq + v.n + 1"
        seq_columns, seq_types = ", expected, n", ", $6::bigint[], $7::bigint[]"
        seq_check = " AND (v.n = 0 OR r.event_seq = v.expected)"
    return f"""
            UPDATE {s}.runs AS r SET
                status = {target_of("complete")}, answer = v.answer, termination_reason = v.reason,
                completed_at = {now}, updated_at = {now}, locked_by = NULL, locked_at = NULL,
                resume_state = NULL, decision = NULL, non_idempotent = false, {seq_set}
            FROM unnest($2::text[], $3::int[], $4::bytea[], $5::text[]{seq_types})
                AS v(id, attempt, answer, reason{seq_columns})
            WHERE r.id = v.id AND r.attempt = v.attempt AND r.locked_by = $1
              AND {still_running("r")}{seq_check}
              AND r.id = ANY(ARRAY(SELECT id FROM locked))
            RETURNING r.id, r.event_seq, r.attempt, r.updated_at, r.termination_reason, r.error"""


def completion(s: str, now: str, *, numbered: bool = False, also: str = "") -> str:
    """A whole completion statement: the batch's rows locked in id order (a completion
    waits for a row another transaction holds: it must be decided, not skipped), then
    ``complete_update`` as ``done``, its ``completed`` events, the CTEs in ``also`` (each
    ``, name AS (...)``), and the ids it applied to. Event rows it writes belong to runs
    it holds.

    Plan: generic, every run row probed by primary key (measured by
    tests/store/test_pg_plans.py)."""
    mine = f"r.locked_by = $1 AND {still_running('r')}"
    return f"""
            WITH locked AS MATERIALIZED ({locked_in_id_order(s, "$2::text[]", mine)}),
            done AS ({complete_update(s, now, numbered=numbered)}),
            logged AS ({completed_events(s, "done")}){also}
            {completed_ids(s, "done")}"""


def heartbeat_sql(s: str, now: str) -> str:
    """Renew a worker's leases: $1 worker, $2 ids, $3 attempts.

    A heartbeat never waits for a run row: rows are locked in id order with SKIP LOCKED, so
    a row another transaction holds (this worker's own completion of the run, the reaper,
    an operator's cancel) is not renewed this time (a run being settled needs no renewal)
    instead of waiting, which is what let a heartbeat and a completion of the same worker
    deadlock. Such a lease is neither renewed nor lost: ``held`` (the leases as the
    statement's snapshot sees them) minus ``locked`` comes back with a NULL attempt, and
    the next heartbeat tells. The workers row is refreshed in the same round trip (a
    data-modifying CTE always runs, referenced or not).

    Plan: generic, every run row probed by primary key (measured by
    tests/store/test_pg_plans.py).
    """
    ours = f"""r.locked_by = $1 AND {still_running("r")}
              AND EXISTS (SELECT 1 FROM v WHERE v.id = r.id AND v.attempt = r.attempt)"""
    return f"""
        WITH w AS (UPDATE {s}.workers SET last_seen_at = {now} WHERE id = $1),
        v AS MATERIALIZED (SELECT * FROM unnest($2::text[], $3::int[]) AS v(id, attempt)),
        held AS MATERIALIZED (
            SELECT r.id FROM {s}.runs r WHERE r.id = ANY($2::text[]) AND {ours}),
        locked AS MATERIALIZED ({locked_in_id_order(s, "$2::text[]", ours, skip_locked=True)}),
        renewed AS (
            UPDATE {s}.runs AS r SET locked_at = {now}
            WHERE r.id = ANY(ARRAY(SELECT id FROM locked))
            RETURNING r.id, r.attempt, r.cancel_requested)
        SELECT id, attempt, cancel_requested FROM renewed
        UNION ALL
        SELECT h.id, NULL, NULL FROM held h
        WHERE NOT EXISTS (SELECT 1 FROM locked l WHERE l.id = h.id)"""


def worker_sql(s: str, now: str) -> dict[str, str]:
    """Lease-holder verbs: heartbeat, completion, failure, pause, cancel settlement."""
    retry = "($4::bool AND attempt < max_attempts AND NOT non_idempotent)"
    return {
        "heartbeat": heartbeat_sql(s, now),
        "complete": completion(s, now),
        # $4 retryable, $5 retry delay, $6 error, $7 sealed error detail. SET sees the old
        # row, so every CASE judges the run as it was before this failure.
        "fail": f"""
            UPDATE {s}.runs SET
                status = CASE WHEN {retry} THEN 'queued' ELSE 'failed' END,
                termination_reason = CASE WHEN {retry} THEN NULL
                    WHEN NOT $4::bool THEN 'not_retryable'
                    WHEN attempt >= max_attempts THEN 'retries_exhausted'
                    ELSE 'not_retryable' END,
                available_at = CASE WHEN {retry}
                    THEN {now} + $5::float8 ELSE available_at END,
                completed_at = CASE WHEN {retry} THEN NULL ELSE {now} END,
                resume_state = CASE WHEN {retry} THEN resume_state ELSE NULL END,
                decision = CASE WHEN {retry} THEN decision ELSE NULL END,
                error = $6, error_detail = $7, locked_by = NULL, locked_at = NULL,
                updated_at = {now}
            WHERE {fenced_where("fail")}
            RETURNING status""",
        "pause": f"""
            UPDATE {s}.runs SET
                status = {target_of("pause")}, pause_reason = $4, resume_state = $5,
                pause_summary = $6,
                decision = NULL, continued_at = NULL, locked_by = NULL, locked_at = NULL,
                updated_at = {now}
            WHERE {fenced_where("pause")}
            RETURNING id""",
        "settle_cancelled": f"""
            UPDATE {s}.runs SET
                status = {target_of("settle_cancelled")}, termination_reason = 'cancelled',
                completed_at = {now}, resume_state = NULL, decision = NULL,
                locked_by = NULL, locked_at = NULL, updated_at = {now}
            WHERE {fenced_where("settle_cancelled")}
            RETURNING id""",
        "set_non_idempotent": f"""
            UPDATE {s}.runs SET non_idempotent = $4
            WHERE {fenced_where("set_non_idempotent")}
            RETURNING id""",
    }


def maintenance_sql(s: str, now: str) -> dict[str, str]:
    """Retention, worker registry, operator reads, key rotation."""

    final = f"status IN ({FINAL_LIST}) AND completed_at < {now} - $1::float8"
    paused = f"status = 'paused' AND updated_at < {now} - $3::float8"

    def purge(where: str) -> str:
        # Locked in small batches with SKIP LOCKED: a run a worker is touching right now is
        # simply left for the next batch; FOR UPDATE rechecks the predicate on the newest
        # version, so a run requeued meanwhile is not deleted.
        return f"""
            WITH victims AS MATERIALIZED (
                SELECT id FROM {s}.runs WHERE {where} LIMIT $2 FOR UPDATE SKIP LOCKED
            ), d AS (
                DELETE FROM {s}.runs WHERE id = ANY(ARRAY(SELECT id FROM victims)) RETURNING 1
            )
            SELECT count(*) FROM d"""

    # Counts by status: sums of the shards of run_counts (migration 0011), kept by
    # statement triggers on runs; a status whose runs are all gone sums to 0 and is left
    # out, as GROUP BY over runs would.
    counts = (
        f"c AS (SELECT status, sum(n)::bigint AS n FROM {s}.run_counts"
        " GROUP BY status HAVING sum(n) <> 0)"
    )
    # The oldest claimable run per deployment by a loose index scan of runs_claim_idx:
    # one probe per distinct (deployment_id, priority), whose first entry is its oldest
    # available_at; a group whose first entry lies in the future has no run waiting yet
    # (a delayed run is not waiting). Independent of the backlog's size.
    oldest = f"""k AS (
            (SELECT deployment_id, priority, available_at FROM {s}.runs
             WHERE status = 'queued' ORDER BY deployment_id, priority, available_at LIMIT 1)
            UNION ALL
            SELECT nxt.* FROM k CROSS JOIN LATERAL (
                SELECT r.deployment_id, r.priority, r.available_at FROM {s}.runs r
                WHERE r.status = 'queued'
                  AND (r.deployment_id, r.priority) > (k.deployment_id, k.priority)
                ORDER BY r.deployment_id, r.priority, r.available_at LIMIT 1
            ) AS nxt
        ),
        d AS (
            SELECT deployment_id, {now} - min(available_at) AS age FROM k
            WHERE available_at <= {now} GROUP BY deployment_id
        )"""
    return {
        # $1 final retention, $2 batch size; $3 paused retention (only when it is on).
        "purge": purge(final),
        # Each kind walks its own partial index and stops at the batch size (one OR would
        # make a bitmap of the whole backlog for every batch); the outer predicate is what
        # FOR UPDATE rechecks on the newest row version.
        "purge_with_paused": purge(
            f"id = ANY(ARRAY((SELECT id FROM {s}.runs WHERE {final} LIMIT $2)"
            f" UNION ALL (SELECT id FROM {s}.runs WHERE {paused} LIMIT $2)))"
            # IS TRUE: the same test, but no index qual, so the ids are probed by key.
            f" AND (({final}) OR ({paused})) IS TRUE"
        ),
        "register_worker": f"""
            INSERT INTO {s}.workers
                (id, hostname, pid, deployment_id, started_at, last_seen_at, settings)
            VALUES ($1, $2, $3, $4, {now}, {now}, $5)
            ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname, pid = excluded.pid,
                deployment_id = excluded.deployment_id, last_seen_at = excluded.last_seen_at,
                settings = excluded.settings""",
        "remove_worker": f"DELETE FROM {s}.workers WHERE id = $1",
        # Skips a row another transaction holds (a late heartbeat of that worker): never
        # waits, so two replicas pruning at once never deadlock.
        "prune_workers": f"""
            WITH gone AS MATERIALIZED (
                SELECT id FROM {s}.workers WHERE last_seen_at < {now} - $1::float8
                ORDER BY id FOR UPDATE SKIP LOCKED
            ), d AS (
                DELETE FROM {s}.workers WHERE id = ANY(ARRAY(SELECT id FROM gone)) RETURNING 1
            )
            SELECT count(*) FROM d""",
        "list_workers": f"""
            SELECT * FROM {s}.workers WHERE last_seen_at >= {now} - $1::float8
            ORDER BY started_at, id""",
        "stats": f"""
            WITH RECURSIVE {counts}, {oldest}
            SELECT (SELECT array_agg(status) FROM c) AS statuses,
                   (SELECT array_agg(n) FROM c) AS ns,
                   (SELECT max(age) FROM d) AS oldest_age""",
        # $1 lock grace, $2 worker max age. The expired-lease count reads every running
        # row through runs_lease_idx (keyed on locked_by, so the heartbeat's locked_at
        # write stays HOT) and filters: at most the fleet's slots.
        "health": f"""
            WITH RECURSIVE {counts}, {oldest}
            SELECT (SELECT array_agg(status) FROM c) AS statuses,
                   (SELECT array_agg(n) FROM c) AS ns,
                   (SELECT max(age) FROM d) AS oldest_age,
                   (SELECT array_agg(deployment_id) FROM d) AS deps,
                   (SELECT array_agg(age) FROM d) AS ages,
                   (SELECT count(*) FROM {s}.runs
                    WHERE status = 'running' AND locked_at < {now} - $1::float8) AS expired,
                   (SELECT count(*) FROM {s}.workers
                    WHERE last_seen_at >= {now} - $2::float8) AS live,
                   x.age AS xact_age, x.pid AS xact_pid
            FROM (SELECT 1) AS one LEFT JOIN ({_OLDEST_TRANSACTION}) AS x ON true""",
        # Rows are locked while re-sealed so a completion cannot slip in between the read
        # and the write and be overwritten with the re-sealed old value. {limit} is filled
        # with an int by reseal_page: a literal LIMIT lets even a generic plan walk the
        # primary key in order instead of sorting the table.
        "reseal_select_template": f"""
            SELECT id, payload, answer, resume_state, decision, error_detail FROM {s}.runs
            WHERE id > $1 ORDER BY id LIMIT {{limit}} FOR NO KEY UPDATE""",
        "reseal_update": f"""
            UPDATE {s}.runs AS r SET payload = v.payload, answer = v.answer,
                resume_state = v.resume_state, decision = v.decision,
                error_detail = v.error_detail
            FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::bytea[], $5::bytea[],
                        $6::bytea[])
                AS v(id, payload, answer, resume_state, decision, error_detail)
            WHERE r.id = v.id""",
    }


def reseal_select(statements: Statements, limit: int) -> str:
    """The rotation page read with a literal LIMIT (an int, never user text)."""
    return statements.reseal_select_template.format(limit=max(int(limit), 1))


#: What a run listing's SQL (``runq.store.listing_sql``) spells this engine's way.
LISTING = ListingDialect(
    table="{schema}.runs",
    # Numbered: the cursor's created_at appears twice.
    placeholder=lambda n: f"${n}",
    # "Submitted by a service account", on the actor JSON (``model.Actor``).
    service_account="coalesce((actor::jsonb ->> 'service_account')::boolean, false)",
)
