-- As on PostgreSQL (0010_run_timeout): a run's own handler deadline, NULL for the
-- configured [queue] timeout_seconds.
ALTER TABLE {schema}_runs ADD COLUMN timeout_seconds REAL;
