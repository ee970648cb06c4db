-- As on PostgreSQL (0003_seal_check): the id of the fleet's sealing key, never the key.
CREATE TABLE IF NOT EXISTS {schema}_seal_check (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    key_id     TEXT NOT NULL,
    updated_at REAL NOT NULL
);
