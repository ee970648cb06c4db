-- The budget gate reads every counter of the current periods at once
-- (usage_in_periods: scope = ? AND period_start = ?). The primary key leads with
-- (scope, subject), so without this index that read scans every counter ever kept.
CREATE INDEX IF NOT EXISTS {schema}_budget_usage_period_idx
    ON {schema}_budget_usage (scope, period_start);
