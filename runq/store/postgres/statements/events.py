"""A run's event log statements: append, list, trim."""

from __future__ import annotations

from runq.store.postgres.statements.common import _still_running
from runq.store.statements import fenced


def _events_sql(s: str, now: str) -> dict[str, str]:
    """The event log. Lifecycle events are written by the triggers of migration 0004; a
    handler's batch reserves its numbers by moving ``runs.event_seq`` under the fence (the
    row lock orders it with every other writer of the run), then inserts the sealed rows in
    the same transaction."""
    fenced("append_events")
    return {
        # $1 worker, then ids, attempts, counts. Rows are locked in id order, so two batches
        # never wait on each other crosswise. Returns each run's last number reserved.
        "events_reserve_many": f"""
            WITH v AS (
                SELECT * FROM unnest($2::text[], $3::int[], $4::bigint[]) AS v(id, attempt, n)
            ),
            locked AS MATERIALIZED (
                SELECT r.id FROM {s}.runs r JOIN v ON r.id = v.id AND r.attempt = v.attempt
                WHERE r.locked_by = $1 AND {_still_running("r")}
                ORDER BY r.id FOR NO KEY UPDATE OF r
            )
            UPDATE {s}.runs AS r SET event_seq = r.event_seq + v.n
            FROM v WHERE r.id = v.id AND r.id = ANY(ARRAY(SELECT id FROM locked))
            RETURNING r.id, r.event_seq""",
        # run ids, attempts, seqs, kinds, sealed data; $6 the NOTIFY channel: one
        # notification per run, naming its last seq.
        "events_insert_many": f"""
            WITH v AS (
                SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[], $5::bytea[])
                    AS v(run_id, attempt, seq, kind, data)
            ),
            ins AS (
                INSERT INTO {s}.run_events (run_id, seq, attempt, at, kind, data)
                SELECT run_id, seq, attempt, {now}, kind, data FROM v
            )
            SELECT count(pg_notify($6::text, 'event:' || run_id || ':' || last))
            FROM (SELECT run_id, max(seq) AS last FROM v GROUP BY run_id) AS l""",
        "events_list": f"""
            SELECT seq, attempt, at, kind, info::text AS info, data FROM {s}.run_events
            WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3""",
        # $2: drop lifecycle details too (level none).
        "events_trim": f"""
            UPDATE {s}.run_events SET data = NULL, info = CASE WHEN $2::bool THEN NULL ELSE info END
            WHERE run_id = $1 AND (data IS NOT NULL OR ($2::bool AND info IS NOT NULL))""",
        "events_sealed": f"""
            SELECT seq, data FROM {s}.run_events WHERE run_id = $1 AND data IS NOT NULL
            ORDER BY seq""",
        "events_reseal": f"""
            UPDATE {s}.run_events AS e SET data = v.data
            FROM unnest($2::bigint[], $3::bytea[]) AS v(seq, data)
            WHERE e.run_id = $1 AND e.seq = v.seq""",
    }
