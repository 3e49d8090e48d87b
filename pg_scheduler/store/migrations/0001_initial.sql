-- 0001: the job table, adopting a pg-scheduler 0.2.x table in place, plus the
-- worker registry, the wake-up trigger and the 0.2.x vacuum metrics table.

CREATE TABLE IF NOT EXISTS scheduled_jobs (
    job_id             TEXT PRIMARY KEY DEFAULT gen_random_uuid()::text,
    job_name           TEXT NOT NULL,
    execution_time     TIMESTAMPTZ NOT NULL,
    status             TEXT DEFAULT 'pending',
    task_data          JSONB,
    created_at         TIMESTAMPTZ DEFAULT CURRENT_TIMESTAMP,
    last_heartbeat     TIMESTAMPTZ,
    lease_until        TIMESTAMPTZ,
    priority           INTEGER DEFAULT 5,
    retry_count        INTEGER DEFAULT 0,
    max_retries        INTEGER DEFAULT 0,
    worker_id          TEXT,
    error_message      TEXT,
    misfire_grace_time INTEGER
);

-- Columns this version adds. 0.2.x readers ignore them.
ALTER TABLE scheduled_jobs
    ADD COLUMN IF NOT EXISTS misfire_grace_time INTEGER,
    ADD COLUMN IF NOT EXISTS task_name       TEXT,
    ADD COLUMN IF NOT EXISTS attempts        INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS rescue_count    INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS started_at      TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS finished_at     TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS result          JSONB,
    ADD COLUMN IF NOT EXISTS error_traceback TEXT,
    ADD COLUMN IF NOT EXISTS timeout         DOUBLE PRECISION,
    ADD COLUMN IF NOT EXISTS retry_policy    JSONB;

-- Rows written by 0.2.x route by their bare function name.
UPDATE scheduled_jobs SET task_name = job_name WHERE task_name IS NULL;
UPDATE scheduled_jobs SET status = 'pending' WHERE status IS NULL;
-- The claim probes the four documented levels; fold anything else onto them.
UPDATE scheduled_jobs
   SET priority = CASE WHEN priority IS NULL THEN 5
                       WHEN priority <= 1 THEN 1
                       WHEN priority <= 3 THEN 3
                       WHEN priority <= 5 THEN 5
                       ELSE 8 END
 WHERE priority IS NULL OR priority NOT IN (1, 3, 5, 8);
-- 0.2.x marked finished rows without a time; vacuum ages rows by finished_at.
UPDATE scheduled_jobs SET finished_at = COALESCE(last_heartbeat, execution_time)
 WHERE finished_at IS NULL AND status IN ('completed', 'failed', 'cancelled', 'expired');

ALTER TABLE scheduled_jobs
    ALTER COLUMN task_name SET NOT NULL,
    ALTER COLUMN status SET NOT NULL,
    ALTER COLUMN status SET DEFAULT 'pending',
    ALTER COLUMN priority SET NOT NULL,
    ALTER COLUMN retry_count SET NOT NULL,
    ALTER COLUMN max_retries SET NOT NULL,
    ALTER COLUMN task_data SET DEFAULT '{"args": [], "kwargs": {}}'::jsonb;

ALTER TABLE scheduled_jobs DROP CONSTRAINT IF EXISTS scheduled_jobs_status_check;
ALTER TABLE scheduled_jobs ADD CONSTRAINT scheduled_jobs_status_check
    CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled', 'expired'));
ALTER TABLE scheduled_jobs DROP CONSTRAINT IF EXISTS scheduled_jobs_priority_check;
ALTER TABLE scheduled_jobs ADD CONSTRAINT scheduled_jobs_priority_check
    CHECK (priority IN (1, 3, 5, 8));

-- 0.2.x indexes: wide, or covering every finished row. Replaced below.
DROP INDEX IF EXISTS idx_jobs_pending_priority;
DROP INDEX IF EXISTS idx_jobs_lease_expiration;
DROP INDEX IF EXISTS idx_jobs_running_heartbeat;
DROP INDEX IF EXISTS idx_jobs_worker_cleanup;

-- The claim walks one priority level at a time in due order; only pending rows
-- are in it, so finished rows cost the claim nothing.
CREATE INDEX IF NOT EXISTS scheduled_jobs_claim_idx
    ON scheduled_jobs (priority, execution_time) WHERE status = 'pending';
-- Heartbeat, rescue and shutdown touch only the running rows of one worker.
CREATE INDEX IF NOT EXISTS scheduled_jobs_running_idx
    ON scheduled_jobs (worker_id) WHERE status = 'running';

-- Live workers: one heartbeat row each.
CREATE TABLE IF NOT EXISTS scheduler_workers (
    worker_id      TEXT PRIMARY KEY,
    hostname       TEXT NOT NULL,
    pid            INTEGER NOT NULL,
    started_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen      TIMESTAMPTZ NOT NULL DEFAULT now(),
    max_concurrent INTEGER NOT NULL,
    tasks          TEXT[] NOT NULL DEFAULT '{}'
);

-- One wake-up per INSERT statement, delivered at commit: a job enqueued inside
-- a transaction that rolls back never wakes anybody.
CREATE OR REPLACE FUNCTION pg_scheduler_notify_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pg_scheduler_jobs', '');
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS scheduled_jobs_notify_insert ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_notify_insert
    AFTER INSERT ON scheduled_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_notify_jobs();

-- The 0.2.x metrics table, kept with its columns.
CREATE TABLE IF NOT EXISTS vacuum_stats (
    stat_date         DATE PRIMARY KEY DEFAULT CURRENT_DATE,
    deleted_completed INTEGER DEFAULT 0,
    deleted_failed    INTEGER DEFAULT 0,
    deleted_cancelled INTEGER DEFAULT 0,
    last_run          TIMESTAMPTZ,
    worker_id         TEXT
);
ALTER TABLE vacuum_stats ADD COLUMN IF NOT EXISTS deleted_expired INTEGER DEFAULT 0;
