-- 0009: the dashboard's job list.

-- The list pages newest first by (created_at, job_id), one status at a time:
-- a keyset page is one short index range per status, however large the
-- table. job_id alone is not enough: new ids are time-ordered (v7), but rows
-- of earlier versions carry random (v4) ids. Running rows are left out (the
-- running index serves them; they are at most the workers' concurrency), so
-- a claim, which makes a row running, never writes to this index: it costs a
-- drain one index insertion per job (the completion), not two.
CREATE INDEX IF NOT EXISTS scheduled_jobs_dashboard_idx
    ON scheduled_jobs (status, created_at, job_id) WHERE status <> 'running';

-- created_at has a default but no NOT NULL: a row written without it would
-- never appear in a keyset page. Give such rows their due time.
UPDATE scheduled_jobs SET created_at = execution_time WHERE created_at IS NULL;
