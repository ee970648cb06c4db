-- A run may carry its own handler deadline (submission option timeout_seconds); NULL keeps
-- the executing replica's [queue] timeout_seconds. Adding a nullable column without a
-- default is a catalog change only: no rewrite of the run table.
ALTER TABLE {schema}.runs ADD COLUMN IF NOT EXISTS timeout_seconds double precision;
