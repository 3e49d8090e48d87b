-- 0005: a rescue counts against max_rescues only for a job that had started.
-- claimed_ahead: claimed into a worker's local buffer and, as far as the
-- database knows, not started yet (set by the claim, cleared by the worker's
-- heartbeat once it starts). A rescue of such a row adds to unstarted_rescues,
-- which has its own, higher cap, instead of rescue_count. Both columns have
-- constant defaults, so adding them rewrites nothing.
ALTER TABLE scheduled_jobs
    ADD COLUMN IF NOT EXISTS claimed_ahead     BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS unstarted_rescues INTEGER NOT NULL DEFAULT 0;
