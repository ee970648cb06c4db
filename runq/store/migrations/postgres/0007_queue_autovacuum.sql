-- The run table churns: every claim and completion leaves a dead row version, and a queue
-- drained at thousands of runs a second makes tens of thousands of them a minute. Dead
-- versions in the claim path's partial index cost every claim a heap visit, so vacuum must
-- keep up with the churn rather than wait for a share of a large table: start after a
-- fixed number of changes, never sleep between pages (cost delay 0, a high cost limit),
-- and vacuum after bulk inserts too, so index-only scans stay index-only. The workers
-- table is rewritten by every heartbeat; it gets the same treatment.
ALTER TABLE {schema}.runs SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0.0,
    autovacuum_analyze_threshold = 20000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_cost_limit = 10000
);
ALTER TABLE {schema}.workers SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 200,
    autovacuum_vacuum_cost_delay = 0
);
