"""Operator statements: workers, stats, reaping, purging, resealing, job lists."""

from __future__ import annotations

from runq.seal import SEALED_COLUMNS
from runq.store.listing_sql import ListingDialect
from runq.store.sqlite.statements.fragments import FENCE, FINAL_IN, LEASE_CLEAR, fence
from runq.store.sqlite.statements.lifecycle import fail_sql
from runq.store.statements import (
    reap_exhausted_error,
    target_of,
)


def reap_sql(t: str) -> str:
    """The reaper's rules as one statement: the rules are CASE arms in their order (inside a
    non-idempotent section, no saved request, out of attempts), and the WHERE rechecks
    staleness on the row itself, so a lease renewed meanwhile is left alone."""
    rule1 = "non_idempotent = 1"
    rule2 = "has_request = 0"
    rule3 = "attempt >= max_attempts"
    dead = f"({rule1} OR {rule2} OR {rule3})"
    stale = "status = 'running' AND locked_at < :now - :grace"
    recheck = "+status = 'running' AND +locked_at < :now - :grace"
    return (
        f"UPDATE {t} SET"
        f" status = CASE WHEN {dead} THEN 'failed' ELSE 'queued' END,"
        f" termination_reason = CASE WHEN {rule1} OR {rule2} THEN 'not_retryable'"
        f"   WHEN {rule3} THEN 'retries_exhausted' ELSE termination_reason END,"
        f" error = CASE WHEN {rule1} THEN :err_non_idempotent"
        f"   WHEN {rule2} THEN :err_no_request"
        f"   WHEN {rule3} THEN {reap_exhausted_error()} ELSE error END,"
        f" completed_at = CASE WHEN {dead} THEN :now ELSE completed_at END,"
        f" available_at = CASE WHEN {dead} THEN available_at ELSE :now END,"
        f" resume_state = CASE WHEN {dead} THEN NULL ELSE resume_state END,"
        f" decision = CASE WHEN {dead} THEN NULL ELSE decision END,"
        " locked_by = NULL, locked_at = NULL, updated_at = :now"
        f" WHERE {recheck} AND id IN ("
        f"   SELECT id FROM {t} INDEXED BY {t}_lease_idx WHERE {stale}"
        "    ORDER BY locked_at, id LIMIT :limit)"
        " RETURNING id, status"
    )


def _oldest_queued(t: str) -> str:
    """Oldest claimable-since time per deployment (``?`` is now) by a loose index scan of
    the claim index: one probe per distinct (deployment_id, priority), whose first entry
    is its oldest available_at; a group whose first entry lies in the future has no run
    waiting yet (a delayed run is not waiting). The step to the next group is two seeks,
    the next priority of the same deployment or else the next deployment: SQLite seeks a
    row-value bound ``(deployment_id, priority) > (?, ?)`` on its first column only and
    would walk the rest of the deployment's entries."""

    def seek(where: str, order: str) -> str:
        return (
            f"(SELECT rowid FROM {t} INDEXED BY {t}_claim_idx"
            f" WHERE status = 'queued' AND {where} ORDER BY {order} LIMIT 1)"
        )

    return (
        "WITH RECURSIVE k(deployment_id, priority, available_at) AS ("
        f" SELECT * FROM (SELECT deployment_id, priority, available_at FROM {t}"
        f"  INDEXED BY {t}_claim_idx WHERE status = 'queued'"
        "  ORDER BY deployment_id, priority, available_at LIMIT 1)"
        " UNION ALL"
        f" SELECT r.deployment_id, r.priority, r.available_at FROM k JOIN {t} AS r"
        " ON r.rowid = coalesce("
        + seek(
            "deployment_id = k.deployment_id AND priority > k.priority", "priority, available_at"
        )
        + ", "
        + seek("deployment_id > k.deployment_id", "deployment_id, priority, available_at")
        + "))"
        " SELECT deployment_id, min(available_at) FROM k WHERE available_at <= ?"
        " GROUP BY deployment_id"
    )


def worker_sql(t: str, workers: str) -> dict[str, str]:
    return {
        "heartbeat": (
            f"UPDATE {t} SET locked_at = :now"
            " FROM (SELECT json_extract(value, '$[0]') AS lid, json_extract(value, '$[1]') AS la"
            "       FROM json_each(:leases)) AS l"
            f" WHERE {t}.id = l.lid AND {t}.attempt = l.la"
            f" AND {t}.locked_by = :worker AND +{t}.status = 'running'"
            f" RETURNING {t}.id, {t}.attempt, {t}.cancel_requested"
        ),
        "touch_worker": f"UPDATE {workers} SET last_seen_at = ? WHERE id = ?",
        # Undo a claim (fenced on the lease it took): queued again, attempt restored.
        "release": (
            f"UPDATE {t} SET status = 'queued', attempt = attempt - 1,"
            " started_at = CASE WHEN attempt = 1 THEN NULL ELSE started_at END,"
            f" error = coalesce(:error, error), updated_at = :now, {LEASE_CLEAR}"
            f" WHERE {FENCE}"
        ),
        "complete": (
            f"UPDATE {t} SET status = {target_of('complete')}, answer = :answer,"
            " termination_reason = :reason, completed_at = :now, updated_at = :now,"
            f" {LEASE_CLEAR}, resume_state = NULL, decision = NULL, non_idempotent = 0"
            f" WHERE {fence('complete')} RETURNING id"
        ),
        "fail": fail_sql(t),
        "pause": (
            f"UPDATE {t} SET status = {target_of('pause')}, pause_reason = :reason,"
            " resume_state = :state, pause_summary = :summary,"
            # continued_at marks "this pause was answered"; a new pause is unanswered.
            f" decision = NULL, continued_at = NULL, updated_at = :now, {LEASE_CLEAR}"
            f" WHERE {fence('pause')} RETURNING id"
        ),
        "settle_cancelled": (
            f"UPDATE {t} SET status = {target_of('settle_cancelled')},"
            " termination_reason = 'cancelled',"
            f" completed_at = :now, updated_at = :now, {LEASE_CLEAR},"
            " resume_state = NULL, decision = NULL"
            f" WHERE {fence('settle_cancelled')} RETURNING id"
        ),
        "non_idempotent": (
            f"UPDATE {t} SET non_idempotent = :inside WHERE {fence('set_non_idempotent')}"
            " RETURNING id"
        ),
    }


def maintenance_sql(t: str, w: str) -> dict[str, str]:
    final = (
        f"SELECT id FROM {t} INDEXED BY {t}_final_idx"
        f" WHERE {FINAL_IN} AND completed_at < :cutoff LIMIT :batch"
    )
    paused = (
        f"SELECT id FROM {t} INDEXED BY {t}_paused_idx"
        " WHERE status = 'paused' AND updated_at < :paused_cutoff LIMIT :batch"
    )
    return {
        "purge": f"DELETE FROM {t} WHERE id IN ({final})",
        # Each kind walks its own partial index; the batch limit covers both.
        "purge_with_paused": (
            f"DELETE FROM {t} WHERE id IN (SELECT id FROM"
            f" (SELECT * FROM ({final}) UNION ALL SELECT * FROM ({paused})) LIMIT :batch)"
        ),
        "register_worker": (
            f"INSERT INTO {w}"
            " (id, hostname, pid, deployment_id, started_at, last_seen_at, settings)"
            " VALUES (:id, :hostname, :pid, :deployment_id, :now, :now, :settings)"
            " ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname, pid = excluded.pid,"
            " deployment_id = excluded.deployment_id, last_seen_at = excluded.last_seen_at,"
            " settings = excluded.settings"
        ),
        "remove_worker": f"DELETE FROM {w} WHERE id = ?",
        "prune_workers": f"DELETE FROM {w} WHERE last_seen_at < ?",
        "list_workers": f"SELECT * FROM {w} WHERE last_seen_at >= ? ORDER BY started_at, id",
        "live_workers": f"SELECT count(*) FROM {w} WHERE last_seen_at >= ?",
        # Kept by the triggers of migration 0011: a few rows, not a walk of the table.
        "counts": f"SELECT status, n FROM {t.removesuffix('_runs')}_run_counts WHERE n <> 0",
        # Oldest claimable-since time per deployment by a loose index scan of the claim
        # index: one probe per distinct (deployment_id, priority), whose first entry is
        # its oldest available_at (covering: no table lookups); a group whose first entry
        # lies in the future has no run waiting yet (a delayed run is not waiting).
        "oldest_queued": _oldest_queued(t),
        "expired_leases": (
            f"SELECT count(*) FROM {t} INDEXED BY {t}_lease_idx"
            " WHERE status = 'running' AND locked_at < ?"
        ),
        "reseal_select": (
            f"SELECT id, {', '.join(SEALED_COLUMNS)} FROM {t} WHERE id > ? ORDER BY id LIMIT ?"
        ),
    }


def reseal_updates_sql(t: str) -> dict[str, str]:
    # Compare-and-set on the old value: a column rewritten meanwhile (an answer stored by a
    # completion) is already under the new key and is left alone.
    return {c: f"UPDATE {t} SET {c} = ? WHERE id = ? AND {c} = ?" for c in SEALED_COLUMNS}


#: What a run listing's SQL (``runq.store.listing_sql``) spells this engine's way.
LISTING = ListingDialect(
    table="{schema}_runs",
    # Numbered: the cursor's created_at appears twice.
    placeholder=lambda n: f"?{n}",
    # "Submitted by a service account", on the actor JSON (``model.Actor``).
    service_account="coalesce(json_extract(actor, '$.service_account'), 0)",
)
