-- 0017: per-key concurrency, rate and order (concurrency keys).
--
-- A job may carry a concurrency_key and its per-key limits: at most
-- max_running_per_key jobs of the key run at once anywhere, at most
-- rate_count_per_key start in any window of rate_period_per_key seconds, and
-- (key_ordered) the key's ordered jobs run one at a time in enqueue order
-- (key_seq). The limits live on the job rows: no per-key counter row exists
-- for every claim to lock. The keyed claim (store/keys.py) takes a
-- transaction-scoped advisory lock per key (skipping keys another claim
-- holds), then counts under it, in a fresh snapshot, what runs and what
-- started in the window, and claims at most what each key has room for.
-- A running row whose lease expires goes back to pending (the rescuer), so
-- a dead worker's slot frees with it.

-- Nullable or with a constant default: adding them rewrites nothing.
ALTER TABLE scheduled_jobs
    ADD COLUMN IF NOT EXISTS concurrency_key     TEXT,
    ADD COLUMN IF NOT EXISTS max_running_per_key INTEGER,
    ADD COLUMN IF NOT EXISTS rate_count_per_key  INTEGER,
    ADD COLUMN IF NOT EXISTS rate_period_per_key DOUBLE PRECISION,
    ADD COLUMN IF NOT EXISTS key_ordered         BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS key_seq             BIGINT;

-- Enqueue order of an ordered key's jobs: a row written with key_ordered
-- takes the next number, by a trigger that fires for those rows only (a
-- column default would call the sequence for every job, and every plain job
-- would carry the number). A REPLACE by dedupe key sets key_seq to NULL: the
-- job takes a new number, at the end of its key's line. Rows already there
-- keep NULL: nothing is rewritten.
CREATE SEQUENCE IF NOT EXISTS scheduled_jobs_key_seq OWNED BY scheduled_jobs.key_seq;
GRANT USAGE ON SEQUENCE scheduled_jobs_key_seq TO PUBLIC;
CREATE OR REPLACE FUNCTION pg_scheduler_key_seq() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    NEW.key_seq := nextval('scheduled_jobs_key_seq');
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS scheduled_jobs_key_seq ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_key_seq
    BEFORE INSERT OR UPDATE OF key_seq ON scheduled_jobs FOR EACH ROW
    WHEN (NEW.key_ordered AND NEW.key_seq IS NULL)
    EXECUTE FUNCTION pg_scheduler_key_seq();

-- Keyed rows are not the plain claim's: its index leaves them out.
DROP INDEX IF EXISTS scheduled_jobs_claim_idx;
CREATE INDEX IF NOT EXISTS scheduled_jobs_claim_idx
    ON scheduled_jobs (queue, task_name, priority, execution_time)
    WHERE status = 'pending' AND concurrency_key IS NULL;

-- The keyed claim: each key's pending unordered rows from its head; each
-- key's running rows (counted); each ordered key's unfinished rows in
-- enqueue order (its head is the only one that may run); and the earliest
-- pending keyed row (the worker's next-due probe).
CREATE INDEX IF NOT EXISTS scheduled_jobs_key_pending_idx
    ON scheduled_jobs (concurrency_key, priority, execution_time)
    WHERE status = 'pending' AND concurrency_key IS NOT NULL AND NOT key_ordered;
CREATE INDEX IF NOT EXISTS scheduled_jobs_key_running_idx
    ON scheduled_jobs (concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS scheduled_jobs_key_order_idx
    ON scheduled_jobs (concurrency_key, key_seq)
    WHERE key_ordered AND status IN ('pending', 'running', 'waiting');
CREATE INDEX IF NOT EXISTS scheduled_jobs_key_due_idx
    ON scheduled_jobs (execution_time)
    WHERE status = 'pending' AND concurrency_key IS NOT NULL;

-- Starts of rate-limited keys: one row per start, appended by the keyed claim
-- under the key's lock; the claim drops its key's rows that left the window.
CREATE TABLE IF NOT EXISTS scheduler_key_starts (
    concurrency_key TEXT NOT NULL,
    started_at      TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS scheduler_key_starts_idx
    ON scheduler_key_starts (concurrency_key, started_at);
