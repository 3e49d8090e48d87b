-- 0002: shared state of periodic jobs, one row per dedup key.

CREATE TABLE IF NOT EXISTS periodic_jobs (
    dedup_key        TEXT PRIMARY KEY,
    job_name         TEXT NOT NULL,
    task_name        TEXT NOT NULL,
    -- "every 60s" or "cron 0 9 * * MON-FRI America/New_York": replicas whose
    -- schedule differs from the stored one do not enqueue this job.
    schedule         TEXT NOT NULL,
    enabled          BOOLEAN NOT NULL DEFAULT true,
    -- The enabled= the code last declared: a runtime change persists until the
    -- code's default changes.
    code_enabled     BOOLEAN NOT NULL DEFAULT true,
    -- The first window not yet enqueued (NULL: start at the next one).
    next_run         TIMESTAMPTZ,
    -- The most recently started run: its window (NULL for a manual run), start,
    -- end, job row and outcome.
    last_window      TIMESTAMPTZ,
    last_run         TIMESTAMPTZ,
    last_finished_at TIMESTAMPTZ,
    last_job_id      TEXT,
    last_outcome     TEXT CHECK (last_outcome IN ('running', 'completed', 'failed', 'skipped')),
    last_error       TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The pending windows of one periodic job (coalescing, disabling): only
-- pending periodic rows are in it, so it stays tiny.
CREATE INDEX IF NOT EXISTS scheduled_jobs_periodic_pending_idx
    ON scheduled_jobs (task_name, execution_time)
    WHERE status = 'pending' AND starts_with(task_name, 'periodic:');

-- pg-scheduler 0.2.x enqueued each next window as 'periodic:<key>:<n>' for a
-- wrapper task 'periodic_<name>' that no longer exists. Those rows would wait
-- forever; the new enqueuer schedules the same jobs itself.
UPDATE scheduled_jobs
   SET status = 'cancelled', finished_at = now(),
       error_message = 'superseded: periodic windows are enqueued by pg_scheduler 0.3'
 WHERE status = 'pending' AND starts_with(job_id, 'periodic:')
   AND starts_with(task_name, 'periodic_');
