-- The `submitted` event is written once per INSERT statement instead of once per row: a
-- statement-level trigger reads the statement's new rows from its transition table and
-- inserts their events with one INSERT ... SELECT. A bulk submit (one COPY of a thousand
-- runs) then runs one trigger call instead of a thousand plpgsql calls, each with its own
-- single-row INSERT: the per-row trigger was most of a bulk submit's time in PostgreSQL.
-- The event is the same (seq = the run's event_seq, its attempt, at = created_at), written
-- inside the same statement, so it can be neither lost nor reordered. Transitions keep the
-- per-row trigger of 0004 (its INSERT branch is no longer called).
CREATE OR REPLACE FUNCTION {schema}.runq_submitted_events() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO {schema}.run_events (run_id, seq, attempt, at, kind)
    SELECT id, event_seq, attempt, created_at, 'submitted' FROM submitted_runs;
    RETURN NULL;
END
$body$;

DROP TRIGGER IF EXISTS runs_event_submitted ON {schema}.runs;
CREATE TRIGGER runs_event_submitted AFTER INSERT ON {schema}.runs
    REFERENCING NEW TABLE AS submitted_runs
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.runq_submitted_events();
