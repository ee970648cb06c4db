-- Fleet-wide flow control. A pause row stops claims of the runs it matches on every
-- replica (a component pattern, stored with its LIKE form so the claim need not rebuild
-- it per row, or a deployment). A rate row counts the starts of one [limits] pattern in
-- its current fixed window; claimers update it under the limits lock.
CREATE TABLE IF NOT EXISTS {schema}.pauses (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('component', 'deployment')),
    target TEXT NOT NULL,
    like_pattern TEXT,
    reason TEXT,
    created_by TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    UNIQUE (kind, target)
);
CREATE TABLE IF NOT EXISTS {schema}.rate_windows (
    pattern TEXT PRIMARY KEY,
    window_start DOUBLE PRECISION NOT NULL,
    used INTEGER NOT NULL
);
-- A run's concurrency key: [limits] max_running_per_key counts running runs per key.
ALTER TABLE {schema}.runs ADD COLUMN IF NOT EXISTS concurrency_key TEXT;
