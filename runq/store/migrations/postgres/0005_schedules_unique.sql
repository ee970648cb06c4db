-- Schedules: one row per configured schedule holds what every replica must agree on
-- (paused or not, how far slots were handled, the last run it made); one row per fired
-- slot, whose primary key is what makes a slot fire once across the whole fleet.
CREATE TABLE IF NOT EXISTS {schema}.schedules (
    name         text PRIMARY KEY,
    paused       boolean NOT NULL DEFAULT false,
    paused_at    double precision,
    cursor_at    double precision NOT NULL,
    last_slot_at double precision,
    last_fire_at double precision,
    last_run_id  text,
    updated_at   double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS {schema}.schedule_slots (
    schedule  text NOT NULL,
    slot_at   double precision NOT NULL,
    run_id    text,
    fired_at  double precision NOT NULL,
    PRIMARY KEY (schedule, slot_at)
);
-- Unique runs: one lock row per (component, key); a submitter takes it before looking at
-- the run it names, so concurrent submitters of the same key queue up behind each other.
CREATE TABLE IF NOT EXISTS {schema}.unique_keys (
    component  text NOT NULL,
    unique_key text NOT NULL,
    run_id     text,
    PRIMARY KEY (component, unique_key)
);
