"""Producer statements: submit one run, submit a batch."""

from __future__ import annotations

INSERT_COLUMNS = (
    "id, component_type, component_id, status, attempt, max_attempts, priority, session_id, "
    "user_id, actor, configuration, deployment_id, idempotency_key, origin, created_at, "
    "updated_at, available_at, has_request, payload, concurrency_key, timeout_seconds"
)


def submit_sql(s: str, now: str) -> str:
    """Idempotency lookup, depth gate and insert in one round trip.

    $1 id, $2 type, $3 component id, $4 max_attempts, $5 priority, $6 session, $7 user,
    $8 actor, $9 configuration, $10 deployment, $11 idempotency key, $12 origin,
    $13 delay, $14 has_request, $15 payload, $16 max_queue_depth (0 = unbounded),
    $17 the NOTIFY channel when the insert should wake the listeners (NULL: no NOTIFY),
    $18 concurrency_key, $19 max_delayed, $20 max_queued_per_user (0 = unbounded),
    $21 the run's own timeout_seconds (NULL: the configured one).
    A due run is gated by the due runs ($16) and a delayed one by the delayed runs ($19), so
    runs far in the future cannot fill the queue for everyone; a user's queued runs are gated
    by $20. Each count stops at its limit (a bounded walk of the queued rows).
    ON CONFLICT covers a concurrent submit of the same key: nothing is returned then and
    the caller re-runs the statement, which now sees the winner in ``existing``.
    """
    return f"""
        WITH existing AS (
            SELECT id, component_type, component_id FROM {s}.runs
            WHERE idempotency_key = $11 AND coalesce(user_id, '') = coalesce($7, '')
        ),
        gate AS (
            SELECT CASE WHEN $13::float8 > 0 THEN $19::bigint > 0 AND (
                SELECT count(*) FROM (
                    SELECT 1 FROM {s}.runs
                    WHERE status = 'queued' AND available_at > {now} LIMIT $19::bigint
                ) AS q
            ) >= $19::bigint ELSE $16::bigint > 0 AND (
                SELECT count(*) FROM (
                    SELECT 1 FROM {s}.runs
                    WHERE status = 'queued' AND available_at <= {now} LIMIT $16::bigint
                ) AS q
            ) >= $16::bigint END AS is_full,
            $20::bigint > 0 AND $7::text IS NOT NULL AND (
                SELECT count(*) FROM (
                    SELECT 1 FROM {s}.runs
                    WHERE user_id = $7 AND status = 'queued' LIMIT $20::bigint
                ) AS u
            ) >= $20::bigint AS user_full
        ),
        ins AS (
            INSERT INTO {s}.runs ({INSERT_COLUMNS})
            SELECT $1, $2, $3, 'queued', 0, $4, $5, $6, $7, $8, $9, $10, $11, $12,
                   {now}, {now}, {now} + $13::float8, $14, $15, $18::text, $21::float8
            WHERE NOT EXISTS (SELECT 1 FROM existing)
              AND NOT (SELECT is_full OR user_full FROM gate)
            ON CONFLICT (idempotency_key, (coalesce(user_id, '')))
                WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING *
        )
        SELECT ins.*,
               (SELECT id FROM existing) AS existing_id,
               (SELECT component_type || '/' || component_id FROM existing)
                   AS existing_component,
               (SELECT is_full FROM gate) AS queue_full,
               (SELECT user_full FROM gate) AS user_full,
               CASE WHEN $17::text IS NOT NULL AND ins.id IS NOT NULL
                    THEN pg_notify($17::text, 'wake') IS NULL END AS notified
        FROM (SELECT 1) AS one LEFT JOIN ins ON true"""


def batch_sql(s: str, now: str) -> dict[str, str]:
    """What ``submit_batch`` asks inside its transaction before its COPY: stored
    idempotency keys of the batch, bounded depth counts (as ``submit_sql``'s gate) and the
    stored runs that answer items."""
    queued = f"SELECT 1 FROM {s}.runs WHERE status = 'queued'"
    return {
        # $1 keys, $2 users ('' for none), pairwise.
        "batch_keys": f"""
            SELECT r.id, r.idempotency_key, coalesce(r.user_id, '') AS user_key,
                   r.component_type || '/' || r.component_id AS component
            FROM unnest($1::text[], $2::text[]) AS k(key, uid)
            JOIN {s}.runs r ON r.idempotency_key = k.key AND coalesce(r.user_id, '') = k.uid""",
        "batch_count_due": f"""
            SELECT count(*) FROM ({queued} AND available_at <= {now} LIMIT $1::bigint) AS q""",
        "batch_count_delayed": f"""
            SELECT count(*) FROM ({queued} AND available_at > {now} LIMIT $1::bigint) AS q""",
        "batch_count_user": f"""
            SELECT count(*) FROM ({queued} AND user_id = $1 LIMIT $2::bigint) AS q""",
        "get_many": f"SELECT * FROM {s}.runs WHERE id = ANY($1::text[])",
    }


#: The columns ``PostgresStore.submit_many`` copies into the run table, in record order: what
#: the single submit's INSERT writes, with the transaction's clock filled in by the caller.
SUBMIT_COPY_COLUMNS: tuple[str, ...] = tuple(c.strip() for c in INSERT_COLUMNS.split(","))
