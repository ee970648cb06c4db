-- As on PostgreSQL (0005_schedules_unique): schedule state, one row per fired slot (its
-- primary key makes a slot fire once), and the lock rows of unique runs.
CREATE TABLE IF NOT EXISTS {schema}_schedules (
    name         TEXT PRIMARY KEY,
    paused       INTEGER NOT NULL DEFAULT 0,
    paused_at    REAL,
    cursor_at    REAL NOT NULL,
    last_slot_at REAL,
    last_fire_at REAL,
    last_run_id  TEXT,
    updated_at   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS {schema}_schedule_slots (
    schedule  TEXT NOT NULL,
    slot_at   REAL NOT NULL,
    run_id    TEXT,
    fired_at  REAL NOT NULL,
    PRIMARY KEY (schedule, slot_at)
);
CREATE TABLE IF NOT EXISTS {schema}_unique_keys (
    component  TEXT NOT NULL,
    unique_key TEXT NOT NULL,
    run_id     TEXT,
    PRIMARY KEY (component, unique_key)
);
