-- The run table is the queue. On SQLite the configured schema is a table prefix: {schema}_runs.
CREATE TABLE IF NOT EXISTS {schema}_runs (
    id                 TEXT PRIMARY KEY,
    component_type     TEXT NOT NULL,
    component_id       TEXT NOT NULL,
    status             TEXT NOT NULL,
    attempt            INTEGER NOT NULL DEFAULT 0,
    max_attempts       INTEGER NOT NULL,
    priority           INTEGER NOT NULL DEFAULT 0,
    session_id         TEXT,
    user_id            TEXT,
    actor              TEXT NOT NULL,
    configuration      TEXT,
    deployment_id      TEXT NOT NULL DEFAULT '',
    idempotency_key    TEXT,
    origin             TEXT NOT NULL,
    created_at         REAL NOT NULL,
    updated_at         REAL NOT NULL,
    available_at       REAL NOT NULL,
    started_at         REAL,
    completed_at       REAL,
    continued_at       REAL,
    locked_by          TEXT,
    locked_at          REAL,
    error              TEXT,
    termination_reason TEXT,
    pause_reason       TEXT,
    cancel_requested   INTEGER NOT NULL DEFAULT 0,
    non_idempotent     INTEGER NOT NULL DEFAULT 0,
    has_request        INTEGER NOT NULL DEFAULT 1,
    payload            BLOB,
    answer             BLOB,
    resume_state       BLOB,
    decision           BLOB,
    tokens             INTEGER NOT NULL DEFAULT 0,
    cost               REAL NOT NULL DEFAULT 0
);

CREATE INDEX IF NOT EXISTS {schema}_runs_claim_idx
    ON {schema}_runs (deployment_id, priority, available_at, id) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS {schema}_runs_session_active_idx
    ON {schema}_runs (session_id, id)
    WHERE session_id IS NOT NULL AND status IN ('queued', 'running', 'paused');
CREATE INDEX IF NOT EXISTS {schema}_runs_lease_idx ON {schema}_runs (locked_at) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS {schema}_runs_final_idx
    ON {schema}_runs (completed_at) WHERE status IN ('completed', 'failed', 'cancelled');
CREATE INDEX IF NOT EXISTS {schema}_runs_paused_idx ON {schema}_runs (updated_at) WHERE status = 'paused';
CREATE UNIQUE INDEX IF NOT EXISTS {schema}_runs_idempotency_idx
    ON {schema}_runs (idempotency_key, coalesce(user_id, '')) WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS {schema}_runs_created_idx ON {schema}_runs (created_at, id);
CREATE INDEX IF NOT EXISTS {schema}_runs_status_created_idx ON {schema}_runs (status, created_at);
CREATE INDEX IF NOT EXISTS {schema}_runs_user_created_idx ON {schema}_runs (user_id, created_at);

CREATE TABLE IF NOT EXISTS {schema}_workers (
    id            TEXT PRIMARY KEY,
    hostname      TEXT NOT NULL,
    pid           INTEGER NOT NULL,
    deployment_id TEXT NOT NULL DEFAULT '',
    started_at    REAL NOT NULL,
    last_seen_at  REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS {schema}_budget_usage (
    scope        TEXT NOT NULL,
    subject      TEXT NOT NULL,
    period_start REAL NOT NULL,
    cost         REAL NOT NULL DEFAULT 0,
    tokens       INTEGER NOT NULL DEFAULT 0,
    runs         INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, subject, period_start)
);
