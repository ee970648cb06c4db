-- A failed run's full error text, sealed like answers (the run's id and the column name
-- are its associated data): ``error`` keeps what ``[privacy] level`` allows, and only
-- admins open this column (GET /queue/jobs/{id}, runq jobs show).
ALTER TABLE {schema}.runs ADD COLUMN IF NOT EXISTS error_detail bytea;
-- The fleet-wide settings each worker runs with (JSON text), so a replica configured
-- differently from its peers is seen by runq status, /queue/stats and the exporter.
ALTER TABLE {schema}.workers ADD COLUMN IF NOT EXISTS settings text;
