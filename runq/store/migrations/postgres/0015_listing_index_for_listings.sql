-- Plans that stay right as the run table grows (docs/INTERNALS.md, "Plans").
--
-- runq's connections keep one generic plan per statement, made at its first execution,
-- which may be on an empty table, where every path costs the same. runs_listing_idx
-- (created_at, id) can answer a condition on id alone by walking the whole index (id is
-- its second column), and on an empty table the planner took that walk for lookups by
-- primary key and kept it as the table grew: a full index scan per completion, heartbeat
-- or claim. With a predicate that only the listings state (always true: created_at is NOT
-- NULL), the index serves the listings and no other statement can use it; a lookup by id
-- then has the primary key as its only index path.
DROP INDEX IF EXISTS {schema}.runs_listing_idx;
CREATE INDEX IF NOT EXISTS runs_listing_idx ON {schema}.runs (created_at, id)
    WHERE created_at IS NOT NULL;
