-- As on PostgreSQL (0002_leaner_indexes): every transition writes into every index, and
-- these two listing indexes did not earn that cost on the claim and completion path.
DROP INDEX IF EXISTS {schema}_runs_created_idx;
DROP INDEX IF EXISTS {schema}_runs_user_created_idx;
CREATE INDEX IF NOT EXISTS {schema}_runs_user_idx
    ON {schema}_runs (user_id, created_at) WHERE user_id IS NOT NULL;
