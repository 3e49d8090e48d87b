-- 0003: housekeeping. What keeps a churning queue table small and its claims fast.

-- The vacuum finds old finished rows of one status through this index instead
-- of scanning the table. Only finished rows carry a finished_at, so pending
-- and running rows (the hot part) are not in it.
CREATE INDEX IF NOT EXISTS scheduled_jobs_finished_idx
    ON scheduled_jobs (status, finished_at) WHERE finished_at IS NOT NULL;

-- Every job is inserted, updated two or three times and, sooner or later,
-- deleted: the table produces dead tuples at the rate jobs run. With the
-- server defaults (20 % of the table must be dead before autovacuum starts)
-- a large table bloats before it is cleaned, and the claim index fills with
-- dead entries the claim has to step over. Clean this table after 1 % churn.
-- fillfactor 90 leaves room on each page so lease renewals (heartbeats, which
-- touch no indexed column) stay HOT updates on the same page.
ALTER TABLE scheduled_jobs SET (
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.01,
    autovacuum_vacuum_cost_delay = 1
);

-- Worker rows are rewritten on every heartbeat; keep those updates on-page.
ALTER TABLE scheduler_workers SET (fillfactor = 50);
