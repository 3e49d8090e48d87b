-- 0019: debounce and throttle on enqueue.
--
-- Debounce: a burst of schedule() calls with one key makes one job, due a
-- quiet period after the burst's last call. The job carries dedupe scope
-- 'debounce', whose unique index has the predicate of scope 'pending' (0013):
-- the key is held until the job really starts, also while it waits claimed
-- ahead in a worker's buffer. Every call is one INSERT ... ON CONFLICT on this
-- index: the first of a burst inserts, the others move the pending holder's
-- due time and take its arguments, so concurrent calls from any number of
-- processes meet the same row. Its own scope keeps debounce keys apart from
-- plain dedupe keys and shows in the job's record which jobs were debounced.
CREATE UNIQUE INDEX IF NOT EXISTS scheduled_jobs_dedupe_debounce_idx
    ON scheduled_jobs (dedupe_key)
    WHERE dedupe_scope = 'debounce' AND NOT started_before
      AND (status = 'pending' OR (status = 'running' AND claimed_ahead));

-- Throttle: at most one job per key and period. One narrow row per key holds
-- its current period: the first call of a period takes the row (an upsert
-- that only overwrites a period that has ended) and writes its job in the
-- same statement; later calls find the row held and write nothing. A job's
-- row may be deleted (retention) long before its period ends: the period
-- lives here, not on the job. Rows are never deleted by the library; a key's
-- row is reused by its next period.
CREATE TABLE IF NOT EXISTS scheduler_throttles (
    throttle_key TEXT PRIMARY KEY,
    job_id       TEXT NOT NULL,
    until        TIMESTAMPTZ NOT NULL
);
