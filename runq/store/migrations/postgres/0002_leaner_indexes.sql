-- Every claim and completion changes indexed columns, so each row version writes an entry
-- into every index of runs. Two listing indexes did not earn that cost on the hot path:
-- runs_created_idx repeated the primary key's order (UUIDv7 ids sort by creation), and
-- runs_user_created_idx indexed every run without a user. Operator listings by time now
-- sort (a top-N sort, tens of milliseconds on 400,000 rows); per-user listings keep an
-- index over the runs that have a user.
DROP INDEX IF EXISTS {schema}.runs_created_idx;
DROP INDEX IF EXISTS {schema}.runs_user_created_idx;
CREATE INDEX IF NOT EXISTS runs_user_idx
    ON {schema}.runs (user_id, created_at) WHERE user_id IS NOT NULL;
