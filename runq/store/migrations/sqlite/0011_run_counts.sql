-- As on PostgreSQL (0011_table_health): run counts by status without scanning the run
-- table. `stats` and `health` counted with GROUP BY status, a walk of every entry of
-- runs_status_created_idx; run_counts holds the count per status, kept by row triggers.
-- SQLite has one writer at a time, so one row per status is no hot spot.
CREATE TABLE IF NOT EXISTS {schema}_run_counts (
    status TEXT PRIMARY KEY,
    n      INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TRIGGER IF NOT EXISTS {schema}_runs_count_insert AFTER INSERT ON {schema}_runs
BEGIN
    INSERT INTO {schema}_run_counts (status, n) VALUES (NEW.status, 1)
    ON CONFLICT (status) DO UPDATE SET n = n + 1;
END;

-- UPDATE OF + WHEN: heartbeats and the other writes that leave status alone never run it.
CREATE TRIGGER IF NOT EXISTS {schema}_runs_count_update
AFTER UPDATE OF status ON {schema}_runs
WHEN OLD.status IS NOT NEW.status
BEGIN
    UPDATE {schema}_run_counts SET n = n - 1 WHERE status = OLD.status;
    INSERT INTO {schema}_run_counts (status, n) VALUES (NEW.status, 1)
    ON CONFLICT (status) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER IF NOT EXISTS {schema}_runs_count_delete AFTER DELETE ON {schema}_runs
BEGIN
    UPDATE {schema}_run_counts SET n = n - 1 WHERE status = OLD.status;
END;

-- The migration runs in one IMMEDIATE transaction: no write can fall between the
-- triggers' creation and this backfill.
DELETE FROM {schema}_run_counts;
INSERT INTO {schema}_run_counts (status, n)
SELECT status, count(*) FROM {schema}_runs GROUP BY status;
