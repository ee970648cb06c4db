-- A transition numbers its lifecycle event after the row's new event_seq instead of the old
-- one. The same for every statement that leaves event_seq alone (all but one); a completion
-- that also writes the events its handler emitted last moves event_seq past them in the
-- same UPDATE (runq/store/postgres/statements/events.py, events_complete_one), so the
-- `completed` event is numbered after them in one statement. Only the function changes;
-- the triggers of 0004 call it by name.
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
    NEW.event_seq := NEW.event_seq + 1;
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
