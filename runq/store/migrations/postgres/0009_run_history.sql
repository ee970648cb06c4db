-- History for every user (GET /runs): newest first, filtered, keyset-paged on
-- (created_at, id). 0002 dropped the plain created_at index to spare the claim path one
-- index write per transition; listing every run by time without it sorts the whole
-- table on each page, so it comes back with id as the tie-breaker, which makes a cursor
-- page one index range scan. A user's own history gets the same order under user_id
-- (replacing runs_user_idx, whose pages had to sort ties on id).
CREATE INDEX IF NOT EXISTS runs_listing_idx ON {schema}.runs (created_at, id);
CREATE INDEX IF NOT EXISTS runs_user_listing_idx
    ON {schema}.runs (user_id, created_at, id) WHERE user_id IS NOT NULL;
DROP INDEX IF EXISTS {schema}.runs_user_idx;
-- What the approver of a paused run is asked to decide (ctx.pause(summary=...)): a short
-- text in clear, readable by approvers who may not open the run.
ALTER TABLE {schema}.runs ADD COLUMN IF NOT EXISTS pause_summary text;
