-- The per-run event log (ctx.emit and the lifecycle events runq appends itself).
-- seq is gap-free per run: one writer at a time on SQLite, so the next number is the
-- largest stored one plus one (a probe of the primary key).
-- info: runq's own metadata of a lifecycle event (attempt, worker, reason), which the run
-- row shows unsealed anyway. data: what a handler emitted, sealed like the payload.
CREATE TABLE IF NOT EXISTS {schema}_run_events (
    run_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    at      REAL NOT NULL,
    kind    TEXT NOT NULL,
    info    TEXT,
    data    BLOB,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

-- Lifecycle events are written by triggers, so they are part of the very statement that
-- changes the run and can be neither lost nor reordered; the verbs stay as they are.
-- The time is the run's updated_at (created_at for `submitted`). A running run that goes
-- back to queued was given back unopened (attempt restored: `released`), failed with a
-- retry (`retry_scheduled`: the error text changes or the retry lies in the future) or
-- reaped (lease expired; error kept, due now).
CREATE TRIGGER IF NOT EXISTS {schema}_runs_event_submitted AFTER INSERT ON {schema}_runs
BEGIN
    INSERT INTO {schema}_run_events (run_id, seq, attempt, at, kind)
    VALUES (NEW.id, 1, NEW.attempt, NEW.created_at, 'submitted');
END;

CREATE TRIGGER IF NOT EXISTS {schema}_runs_event_transition
AFTER UPDATE OF status, cancel_requested ON {schema}_runs
WHEN OLD.status IS NOT NEW.status OR (NEW.cancel_requested AND NOT OLD.cancel_requested)
BEGIN
    INSERT INTO {schema}_run_events (run_id, seq, attempt, at, kind, info)
    SELECT NEW.id,
           coalesce((SELECT max(seq) FROM {schema}_run_events WHERE run_id = NEW.id), 0) + 1,
           NEW.attempt, NEW.updated_at, k.kind,
           CASE k.kind
               WHEN 'claimed' THEN json_object('attempt', NEW.attempt, 'worker', NEW.locked_by)
               WHEN 'released' THEN json_object('reason', NEW.error)
               WHEN 'retry_scheduled'
                   THEN json_object('reason', NEW.error, 'available_at', NEW.available_at)
               WHEN 'reaped' THEN json_object('attempt', OLD.attempt, 'worker', OLD.locked_by)
               WHEN 'paused' THEN json_object('reason', NEW.pause_reason)
               WHEN 'completed' THEN json_object(
                   'termination_reason', NEW.termination_reason, 'error', NEW.error)
               WHEN 'failed' THEN json_object(
                   'termination_reason', NEW.termination_reason, 'error', NEW.error)
               WHEN 'cancelled' THEN json_object(
                   'termination_reason', NEW.termination_reason, 'error', NEW.error)
           END
    FROM (SELECT CASE
        WHEN NEW.status = OLD.status THEN 'cancel_requested'
        WHEN NEW.status = 'running' THEN 'claimed'
        WHEN NEW.status = 'queued' AND OLD.status = 'paused' THEN 'continued'
        WHEN NEW.status = 'queued' AND OLD.status <> 'running' THEN 'requeued'
        WHEN NEW.status = 'queued' AND NEW.attempt < OLD.attempt THEN 'released'
        WHEN NEW.status = 'queued' AND (NEW.error IS NOT OLD.error
                                        OR NEW.available_at > NEW.updated_at)
            THEN 'retry_scheduled'
        WHEN NEW.status = 'queued' THEN 'reaped'
        ELSE NEW.status END AS kind) AS k;
END;

-- Events go with their run (the purge deletes runs; foreign keys are not enforced here).
CREATE TRIGGER IF NOT EXISTS {schema}_runs_event_purge AFTER DELETE ON {schema}_runs
BEGIN
    DELETE FROM {schema}_run_events WHERE run_id = OLD.id;
END;
