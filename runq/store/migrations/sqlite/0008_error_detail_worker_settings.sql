-- As on PostgreSQL (0008_error_detail_worker_settings): a failed run's full error text,
-- sealed, for admins only; and the fleet-wide settings each worker runs with (JSON).
ALTER TABLE {schema}_runs ADD COLUMN error_detail BLOB;
ALTER TABLE {schema}_workers ADD COLUMN settings TEXT;
