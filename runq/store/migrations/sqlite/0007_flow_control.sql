-- As on PostgreSQL (0006_flow_control): fleet-wide pauses, and the starts of each rate
-- limited pattern in its current window. SQLite matches patterns with GLOB, whose ``*`` is
-- the pattern's own wildcard, so no LIKE form is stored.
CREATE TABLE IF NOT EXISTS {schema}_pauses (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('component', 'deployment')),
    target TEXT NOT NULL,
    like_pattern TEXT,
    reason TEXT,
    created_by TEXT,
    created_at REAL NOT NULL,
    UNIQUE (kind, target)
);
CREATE TABLE IF NOT EXISTS {schema}_rate_windows (
    pattern TEXT PRIMARY KEY,
    window_start REAL NOT NULL,
    used INTEGER NOT NULL
);
-- A run's concurrency key: [limits] max_running_per_key counts running runs per key.
ALTER TABLE {schema}_runs ADD COLUMN concurrency_key TEXT;
