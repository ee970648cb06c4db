-- The run table is the queue. {schema} is replaced by the configured schema name,
-- which config validation restricts to [a-z_][a-z0-9_]*.
CREATE TABLE IF NOT EXISTS {schema}.runs (
    id                 text PRIMARY KEY,
    component_type     text NOT NULL,
    component_id       text NOT NULL,
    status             text NOT NULL,
    attempt            integer NOT NULL DEFAULT 0,
    max_attempts       integer NOT NULL,
    priority           integer NOT NULL DEFAULT 0,
    session_id         text,
    user_id            text,
    actor              text NOT NULL,           -- JSON of model.Actor
    configuration      text,
    deployment_id      text NOT NULL DEFAULT '', -- '' = none, so the claim index can lead with it
    idempotency_key    text,
    origin             text NOT NULL,
    created_at         double precision NOT NULL,
    updated_at         double precision NOT NULL,
    available_at       double precision NOT NULL,
    started_at         double precision,
    completed_at       double precision,
    continued_at       double precision,        -- set by continue, cleared by the next pause
    locked_by          text,
    locked_at          double precision,
    error              text,
    termination_reason text,
    pause_reason       text,
    cancel_requested   boolean NOT NULL DEFAULT false,
    non_idempotent     boolean NOT NULL DEFAULT false,
    has_request        boolean NOT NULL DEFAULT true,
    payload            bytea,                   -- sealed
    answer             bytea,                   -- sealed
    resume_state       bytea,                   -- sealed
    decision           bytea,                   -- sealed
    tokens             bigint NOT NULL DEFAULT 0,
    cost               double precision NOT NULL DEFAULT 0
);

-- The claim path: only queued rows, in claim order, per deployment. Final rows never enter it.
CREATE INDEX IF NOT EXISTS runs_claim_idx
    ON {schema}.runs (deployment_id, priority, available_at, id) WHERE status = 'queued';
-- The session rule looks for older or running siblings among the non-final runs only.
CREATE INDEX IF NOT EXISTS runs_session_active_idx
    ON {schema}.runs (session_id, id)
    WHERE session_id IS NOT NULL AND status IN ('queued', 'running', 'paused');
-- The reaper scans running leases by age.
CREATE INDEX IF NOT EXISTS runs_lease_idx ON {schema}.runs (locked_at) WHERE status = 'running';
-- Retention deletes final rows by age, paused ones by last update.
CREATE INDEX IF NOT EXISTS runs_final_idx
    ON {schema}.runs (completed_at) WHERE status IN ('completed', 'failed', 'cancelled');
CREATE INDEX IF NOT EXISTS runs_paused_idx ON {schema}.runs (updated_at) WHERE status = 'paused';
CREATE UNIQUE INDEX IF NOT EXISTS runs_idempotency_idx
    ON {schema}.runs (idempotency_key, coalesce(user_id, '')) WHERE idempotency_key IS NOT NULL;
-- Operator listings: all runs by time, or one status by time.
CREATE INDEX IF NOT EXISTS runs_created_idx ON {schema}.runs (created_at, id);
CREATE INDEX IF NOT EXISTS runs_status_created_idx ON {schema}.runs (status, created_at);
CREATE INDEX IF NOT EXISTS runs_user_created_idx ON {schema}.runs (user_id, created_at);

-- A queue table churns: vacuum and analyze it early so dead tuples do not slow the claim.
ALTER TABLE {schema}.runs SET (
    fillfactor = 85,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_limit = 2000
);

CREATE TABLE IF NOT EXISTS {schema}.workers (
    id            text PRIMARY KEY,
    hostname      text NOT NULL,
    pid           integer NOT NULL,
    deployment_id text NOT NULL DEFAULT '',
    started_at    double precision NOT NULL,
    last_seen_at  double precision NOT NULL
);

CREATE TABLE IF NOT EXISTS {schema}.budget_usage (
    scope        text NOT NULL,
    subject      text NOT NULL,
    period_start double precision NOT NULL,
    cost         double precision NOT NULL DEFAULT 0,
    tokens       bigint NOT NULL DEFAULT 0,
    runs         bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, subject, period_start)
);
