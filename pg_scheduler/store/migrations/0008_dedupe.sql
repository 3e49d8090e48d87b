-- 0008: dedupe keys. A job may carry a key; at most one job per key
-- holds it at a time, enforced by a partial unique index per scope, so it holds
-- under concurrent schedules and in bulk. Rows without a key (dedupe_scope NULL)
-- match neither predicate and are never entered in these indexes.

-- Nullable without a default: adding them rewrites nothing.
ALTER TABLE scheduled_jobs
    ADD COLUMN IF NOT EXISTS dedupe_key   TEXT,
    ADD COLUMN IF NOT EXISTS dedupe_scope TEXT;

-- Scope 'active': the key is held while the job is pending or running
-- (including a pending retry of it). Finished rows never hold it.
CREATE UNIQUE INDEX IF NOT EXISTS scheduled_jobs_dedupe_active_idx
    ON scheduled_jobs (dedupe_key)
    WHERE dedupe_scope = 'active' AND status IN ('pending', 'running');

-- Scope 'pending': the key is held only until the job first starts. started_at
-- is set by the first claim and never cleared by a retry, a hand-back or a
-- rescue, so a job that went back to pending never collides with its successor.
CREATE UNIQUE INDEX IF NOT EXISTS scheduled_jobs_dedupe_pending_idx
    ON scheduled_jobs (dedupe_key)
    WHERE dedupe_scope = 'pending' AND status = 'pending' AND started_at IS NULL;
