"""A run's event log statements: append, list, trim."""

from __future__ import annotations

from runq.store.postgres.statements.fragments import locked_in_id_order, still_running
from runq.store.postgres.statements.operations import completion
from runq.store.statements import fenced


def _events_in_order(s: str, where: str) -> str:
    """The event rows passing ``where`` locked in (run_id, seq) order, the order every
    statement that waits for several event rows takes them in (lock order), as a
    MATERIALIZED CTE ``locked`` the write names by primary key."""
    return f"""
            WITH locked AS MATERIALIZED (
                SELECT run_id, seq FROM {s}.run_events WHERE {where}
                ORDER BY run_id, seq FOR NO KEY UPDATE
            )"""


def _in_locked(alias: str = "") -> str:
    p = f"{alias}." if alias else ""
    return f"({p}run_id, {p}seq) IN (SELECT run_id, seq FROM locked)"


def events_sql(s: str, now: str) -> dict[str, str]:
    """The event log. Claims and completions log their own lifecycle events, the
    transition trigger the other transitions, and ``submitted`` is the run row itself; a
    handler's batch reserves its numbers by moving ``runs.event_seq`` under the fence (the
    row lock orders it with every other writer of the run), then inserts the sealed rows in
    the same transaction."""
    fenced("append_events")
    fenced_lease = f"""r.locked_by = $1 AND {still_running("r")}
                AND EXISTS (SELECT 1 FROM v WHERE v.id = r.id AND v.attempt = r.attempt)"""
    return {
        # $1 worker, then ids, attempts, counts. Rows are locked in id order, so two batches
        # never wait on each other crosswise; every listed run is locked, and those with a
        # count above 0 move (a completion batch locks all its runs here first, the ones
        # carrying no events with 0). Returns each moved run's last number reserved.
        "events_reserve_many": f"""
            WITH v AS MATERIALIZED (
                SELECT * FROM unnest($2::text[], $3::int[], $4::bigint[]) AS v(id, attempt, n)
            ),
            locked AS MATERIALIZED ({locked_in_id_order(s, "$2::text[]", fenced_lease)})
            UPDATE {s}.runs AS r SET event_seq = r.event_seq + v.n
            FROM v WHERE r.id = v.id AND v.n > 0 AND r.id = ANY(ARRAY(SELECT id FROM locked))
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
        # A completion batch with the events its handlers emitted last (numbers reserved
        # by events_reserve_many in the same transaction) and the privacy trim of the runs
        # it completes: $1-$5 as ``complete``; $6-$10 the events (run ids, seqs, attempts,
        # kinds, sealed data); $11 runs whose stored data is cleared (metadata, none); $12-$14
        # re-sealed redacted data (run ids, seqs, data). Everything but the completion
        # applies only to runs the fenced completion applied to. Sibling CTEs see the
        # table as it was before the statement, so the trims never touch the rows inserted
        # here (those are written as the level keeps them).
        "events_complete_many": completion(
            s,
            now,
            also=f""",
            ins AS (
                INSERT INTO {s}.run_events (run_id, seq, attempt, at, kind, data)
                SELECT e.run_id, e.seq, e.attempt, {now}, e.kind, e.data
                FROM unnest($6::text[], $7::bigint[], $8::int[], $9::text[], $10::bytea[])
                    AS e(run_id, seq, attempt, kind, data)
                WHERE e.run_id IN (SELECT id FROM done)
            ),
            cleared AS (
                UPDATE {s}.run_events SET data = NULL
                WHERE run_id = ANY($11::text[]) AND run_id IN (SELECT id FROM done)
                  AND data IS NOT NULL
            ),
            resealed AS (
                UPDATE {s}.run_events AS e SET data = x.data
                FROM unnest($12::text[], $13::bigint[], $14::bytea[]) AS x(run_id, seq, data)
                WHERE e.run_id = x.run_id AND e.seq = x.seq
                  AND x.run_id IN (SELECT id FROM done)
            )""",
        ),
        # The same in one statement when every carried event's number is known: $6 the
        # event_seq each run must still have (what this replica last saw: its claim or its
        # last append), $7 how many events it carries; $8-$12 the events; $13 runs whose
        # stored data is cleared (metadata). A run whose event_seq moved meanwhile (a cancel
        # request's event) is left alone, not completed: the caller writes it again with
        # events_complete_many. The ``completed`` event is numbered after the carried ones.
        "events_complete_one": completion(
            s,
            now,
            numbered=True,
            also=f""",
            ins AS (
                INSERT INTO {s}.run_events (run_id, seq, attempt, at, kind, data)
                SELECT e.run_id, e.seq, e.attempt, {now}, e.kind, e.data
                FROM unnest($8::text[], $9::bigint[], $10::int[], $11::text[], $12::bytea[])
                    AS e(run_id, seq, attempt, kind, data)
                WHERE e.run_id IN (SELECT id FROM done)
            ),
            cleared AS (
                UPDATE {s}.run_events SET data = NULL
                WHERE run_id = ANY($13::text[]) AND run_id IN (SELECT id FROM done)
                  AND data IS NOT NULL
            )""",
        ),
        # Level none, after the completion (its `completed` row included).
        "events_wipe_many": f"""{
            _events_in_order(
                s, "run_id = ANY($1::text[]) AND (data IS NOT NULL OR info IS NOT NULL)"
            )
        }
            UPDATE {s}.run_events SET data = NULL, info = NULL
            WHERE run_id = ANY($1::text[]) AND {_in_locked()}""",
        # What the runs of a completion batch stored (redacted in the same transaction).
        "events_sealed_many": f"""
            SELECT run_id, seq, data FROM {s}.run_events
            WHERE run_id = ANY($1::text[]) AND data IS NOT NULL ORDER BY run_id, seq""",
        # Key rotation: the handler data of a page of runs not sealed under key $2, locked
        # so no trim lands between the read and the re-seal.
        "events_rotation_select": f"""
            SELECT run_id, seq, data FROM {s}.run_events
            WHERE run_id = ANY($1::text[]) AND data IS NOT NULL
              AND substring(data FROM 4 FOR 8) IS DISTINCT FROM $2::bytea
            ORDER BY run_id, seq FOR UPDATE""",
        "events_rotation_update": f"""
            UPDATE {s}.run_events AS e SET data = x.data
            FROM unnest($1::text[], $2::bigint[], $3::bytea[]) AS x(run_id, seq, data)
            WHERE e.run_id = x.run_id AND e.seq = x.seq""",
        # ``submitted`` is not stored (migration 0014): it is the run row, seq 1. A seq-1
        # row stored by an earlier version (a ``submitted`` one, or a run older than the
        # event log, whose first event took 1) is listed instead.
        "events_list": f"""
            (SELECT 1::bigint AS seq, 0 AS attempt, r.created_at AS at,
                    'submitted' AS kind, NULL::text AS info, NULL::bytea AS data
             FROM {s}.runs r
             WHERE r.id = $1 AND $2 < 1
               AND NOT EXISTS (SELECT 1 FROM {s}.run_events o WHERE o.run_id = $1 AND o.seq = 1))
            UNION ALL
            (SELECT seq, attempt, at, kind, info::text AS info, data FROM {s}.run_events
             WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3)
            ORDER BY seq LIMIT $3""",
        # $2: drop lifecycle details too (level none). A trim holds no run row, so its event
        # rows are taken in order (a key rotation may hold some of them).
        "events_trim": f"""{
            _events_in_order(
                s, "run_id = $1 AND (data IS NOT NULL OR ($2::bool AND info IS NOT NULL))"
            )
        }
            UPDATE {s}.run_events SET data = NULL, info = CASE WHEN $2::bool THEN NULL ELSE info END
            WHERE run_id = $1 AND {_in_locked()}""",
        "events_sealed": f"""
            SELECT seq, data FROM {s}.run_events WHERE run_id = $1 AND data IS NOT NULL
            ORDER BY seq""",
        "events_reseal": f"""{_events_in_order(s, "run_id = $1 AND seq = ANY($2::bigint[])")}
            UPDATE {s}.run_events AS e SET data = v.data
            FROM unnest($2::bigint[], $3::bytea[]) AS v(seq, data)
            WHERE e.run_id = $1 AND e.seq = v.seq AND {_in_locked("e")}""",
    }
