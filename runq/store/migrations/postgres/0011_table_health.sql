-- Table health at scale.
--
-- 1. Run counts by status without scanning the run table. `stats` and `health` (every
-- exporter refresh, `runq status`) counted with GROUP BY status: a sequential scan of the
-- whole table, 320-370 ms at 1,000,000 final rows. run_counts holds the counts as sums of
-- per-shard deltas kept by statement-level triggers: one upsert per status a statement
-- changed (a claim of 16, a completion batch, a COPY of 10,000, a purge batch), not one
-- per row. A counter row is locked from the statement until commit, so each backend
-- writes its own shard (pid modulo 64): two replicas' claims never wait for each other
-- on the 'queued' counter unless their pids collide. A shard's count may go negative (a
-- run submitted by one backend, claimed by another); only the sum per status means
-- anything. Readers sum at most 64 rows per status.
CREATE TABLE IF NOT EXISTS {schema}.run_counts (
    status text NOT NULL,
    shard  integer NOT NULL,
    n      bigint NOT NULL,
    PRIMARY KEY (status, shard)
);
-- Every change is an update of one of a few hundred rows: vacuum it early, like runs.
ALTER TABLE {schema}.run_counts SET (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

-- One function for the three triggers (PostgreSQL allows a transition table only on a
-- single-event trigger); plpgsql plans a branch only when it runs, so each branch may
-- name only its own event's transition tables. ORDER BY status: every statement locks
-- its counter rows in the same order, so two statements cannot deadlock on them. HAVING
-- drops net-zero changes: a heartbeat or a usage write updates rows without moving any
-- between statuses and writes nothing here.
CREATE OR REPLACE FUNCTION {schema}.runq_count_runs() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {schema}.run_counts AS c (status, shard, n)
        SELECT status, pg_backend_pid() % 64, count(*) FROM runq_new GROUP BY status
        ORDER BY status
        ON CONFLICT (status, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO {schema}.run_counts AS c (status, shard, n)
        SELECT status, pg_backend_pid() % 64, -count(*) FROM runq_old GROUP BY status
        ORDER BY status
        ON CONFLICT (status, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSE
        INSERT INTO {schema}.run_counts AS c (status, shard, n)
        SELECT status, pg_backend_pid() % 64, sum(d) FROM (
            SELECT status, 1 AS d FROM runq_new
            UNION ALL
            SELECT status, -1 AS d FROM runq_old
        ) AS moved
        GROUP BY status HAVING sum(d) <> 0
        ORDER BY status
        ON CONFLICT (status, shard) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    RETURN NULL;
END
$body$;

CREATE OR REPLACE FUNCTION {schema}.runq_count_truncate() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    DELETE FROM {schema}.run_counts;
    RETURN NULL;
END
$body$;

-- The lock first: it waits for every transaction writing runs to end and holds new ones
-- back until this migration commits, so the backfill below counts exactly the rows the
-- triggers will not see.
LOCK TABLE {schema}.runs IN SHARE ROW EXCLUSIVE MODE;
DROP TRIGGER IF EXISTS runs_count_insert ON {schema}.runs;
CREATE TRIGGER runs_count_insert AFTER INSERT ON {schema}.runs
    REFERENCING NEW TABLE AS runq_new
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.runq_count_runs();
DROP TRIGGER IF EXISTS runs_count_update ON {schema}.runs;
CREATE TRIGGER runs_count_update AFTER UPDATE ON {schema}.runs
    REFERENCING OLD TABLE AS runq_old NEW TABLE AS runq_new
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.runq_count_runs();
DROP TRIGGER IF EXISTS runs_count_delete ON {schema}.runs;
CREATE TRIGGER runs_count_delete AFTER DELETE ON {schema}.runs
    REFERENCING OLD TABLE AS runq_old
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.runq_count_runs();
DROP TRIGGER IF EXISTS runs_count_truncate ON {schema}.runs;
CREATE TRIGGER runs_count_truncate AFTER TRUNCATE ON {schema}.runs
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.runq_count_truncate();
DELETE FROM {schema}.run_counts;
INSERT INTO {schema}.run_counts (status, shard, n)
SELECT status, 0, count(*) FROM {schema}.runs GROUP BY status;

-- 2. A HOT-eligible heartbeat. The heartbeat changes only locked_at, but runs_lease_idx
-- was keyed on locked_at, so every heartbeat wrote a new entry into every index of the
-- run table. Keyed on locked_by (which only the claim and the settling writes change,
-- and they change status too), the heartbeat's new row version can stay on its page
-- with no index entries. The reaper and the expired-lease count now read every running
-- row through the partial index and filter on locked_at: at most the fleet's slots.
DROP INDEX IF EXISTS {schema}.runs_lease_idx;
CREATE INDEX IF NOT EXISTS runs_lease_idx
    ON {schema}.runs (locked_by) WHERE status = 'running';
