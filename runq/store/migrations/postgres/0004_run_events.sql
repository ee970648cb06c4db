-- The per-run event log (ctx.emit and the lifecycle events runq appends itself).
-- seq is gap-free per run: runs.event_seq holds the last number given, and every writer
-- allocates under the run row's lock (an UPDATE of the run), so events commit in seq order.
-- Runs that existed before this migration start at 0 (they have no events); new runs
-- start at 1, their `submitted` event.
ALTER TABLE {schema}.runs ADD COLUMN IF NOT EXISTS event_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE {schema}.runs ALTER COLUMN event_seq SET DEFAULT 1;

-- info: runq's own metadata of a lifecycle event (attempt, worker, reason), which the run
-- row shows unsealed anyway. data: what a handler emitted, sealed like the payload.
CREATE TABLE IF NOT EXISTS {schema}.run_events (
    run_id  text NOT NULL REFERENCES {schema}.runs (id) ON DELETE CASCADE,
    seq     bigint NOT NULL,
    attempt integer NOT NULL,
    at      double precision NOT NULL,
    kind    text NOT NULL,
    info    jsonb,
    data    bytea,
    PRIMARY KEY (run_id, seq)
);

-- Lifecycle events are written by triggers, so they are part of the very statement that
-- changes the run and can be neither lost nor reordered; the verbs stay as they are.
-- The time is the run's updated_at (created_at for `submitted`): every verb sets it from
-- the database clock. A running run that goes back to queued was given back unopened
-- (attempt restored: `released`), failed with a retry (`retry_scheduled`: the error text
-- changes or the retry lies in the future) or reaped (lease expired; error kept, due now).
CREATE OR REPLACE FUNCTION {schema}.runq_lifecycle_event() RETURNS trigger
LANGUAGE plpgsql AS $body$
DECLARE
    k text;
    i jsonb;
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {schema}.run_events (run_id, seq, attempt, at, kind)
        VALUES (NEW.id, NEW.event_seq, NEW.attempt, NEW.created_at, 'submitted');
        RETURN NULL;
    END IF;
    IF NEW.status = OLD.status THEN
        k := 'cancel_requested';
    ELSIF NEW.status = 'running' THEN
        k := 'claimed';
        i := jsonb_build_object('attempt', NEW.attempt, 'worker', NEW.locked_by);
    ELSIF NEW.status = 'queued' AND OLD.status = 'paused' THEN
        k := 'continued';
    ELSIF NEW.status = 'queued' AND OLD.status <> 'running' THEN
        k := 'requeued';
    ELSIF NEW.status = 'queued' AND NEW.attempt < OLD.attempt THEN
        k := 'released';
        i := jsonb_build_object('reason', NEW.error);
    ELSIF NEW.status = 'queued' AND (NEW.error IS DISTINCT FROM OLD.error
                                     OR NEW.available_at > NEW.updated_at) THEN
        k := 'retry_scheduled';
        i := jsonb_build_object('reason', NEW.error, 'available_at', NEW.available_at);
    ELSIF NEW.status = 'queued' THEN
        k := 'reaped';
        i := jsonb_build_object('attempt', OLD.attempt, 'worker', OLD.locked_by);
    ELSIF NEW.status = 'paused' THEN
        k := 'paused';
        i := jsonb_build_object('reason', NEW.pause_reason);
    ELSE
        k := NEW.status;
        i := jsonb_build_object('termination_reason', NEW.termination_reason, 'error', NEW.error);
    END IF;
    NEW.event_seq := OLD.event_seq + 1;
    INSERT INTO {schema}.run_events (run_id, seq, attempt, at, kind, info)
    VALUES (NEW.id, NEW.event_seq, NEW.attempt, NEW.updated_at, k, i);
    IF NEW.status IN ('completed', 'failed', 'cancelled', 'paused') THEN
        -- Followers and waiters on any replica hear this at commit (the listener's
        -- channel); the other lifecycle events reach them by their slow poll.
        PERFORM pg_notify('runq_{schema}', 'event:' || NEW.id || ':' || NEW.event_seq);
    END IF;
    RETURN NEW;
END
$body$;

DROP TRIGGER IF EXISTS runs_event_submitted ON {schema}.runs;
CREATE TRIGGER runs_event_submitted AFTER INSERT ON {schema}.runs
    FOR EACH ROW EXECUTE FUNCTION {schema}.runq_lifecycle_event();
-- UPDATE OF + WHEN: heartbeats, usage and the other writes that change neither column
-- never call the function.
DROP TRIGGER IF EXISTS runs_event_transition ON {schema}.runs;
CREATE TRIGGER runs_event_transition BEFORE UPDATE OF status, cancel_requested ON {schema}.runs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR (NEW.cancel_requested AND NOT OLD.cancel_requested))
    EXECUTE FUNCTION {schema}.runq_lifecycle_event();
