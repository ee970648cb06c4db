-- As on PostgreSQL (0009_run_history): the history listing of GET /runs pages on
-- (created_at, id), newest first, for every run or one user's.
CREATE INDEX IF NOT EXISTS {schema}_runs_listing_idx ON {schema}_runs (created_at, id);
CREATE INDEX IF NOT EXISTS {schema}_runs_user_listing_idx
    ON {schema}_runs (user_id, created_at, id) WHERE user_id IS NOT NULL;
DROP INDEX IF EXISTS {schema}_runs_user_idx;
-- What the approver of a paused run is asked to decide, in clear.
ALTER TABLE {schema}_runs ADD COLUMN pause_summary TEXT;
