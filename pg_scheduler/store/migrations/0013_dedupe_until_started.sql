-- 0013: a dedupe key of scope 'pending' is held until the job really starts,
-- not until it is first claimed.
--
-- A claim marks the rows it takes beyond the worker's free slots claimed_ahead
-- (0005): they wait in the worker's buffer, and the worker's heartbeat clears
-- the mark once they start. Such a row has not started: it keeps its key while
-- it waits, and when it is handed back unstarted (queue paused, the buffer's
-- time limit, shutdown) or rescued unstarted it goes back to pending still
-- holding it.
--
-- started_before: an earlier attempt of this job started. Set when a started
-- attempt goes back to pending (a retry, a hand-back or a rescue of a row not
-- claimed ahead; an operator's retry of a job that was ever claimed), never
-- cleared except by REPLACE, which writes a new job. So a row that let its key
-- go never takes it back behind the back of the job that took it since: every
-- statement that moves a row into the index's predicate is one that may meet
-- the key taken (an insert, REPLACE, an operator's retry), never a claim, a
-- hand-back, a retry or a rescue.
--
-- The claim writes nothing new: a row it starts at once (claimed_ahead false)
-- is outside the predicate whatever started_before says. A constant default:
-- adding the column rewrites nothing.
ALTER TABLE scheduled_jobs
    ADD COLUMN IF NOT EXISTS started_before BOOLEAN NOT NULL DEFAULT false;

-- Rows written before this migration keep 0008's rule (a row once claimed
-- does not hold its key), so the new index cannot meet two holders of one key
-- that 0008 allowed. Only while the index still has 0008's predicate: a
-- re-application leaves today's rows alone.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_index i
         WHERE i.indexrelid = to_regclass('scheduled_jobs_dedupe_pending_idx')
           AND pg_get_expr(i.indpred, i.indrelid) LIKE '%started_before%'
    ) THEN
        UPDATE scheduled_jobs SET started_before = true
         WHERE dedupe_scope = 'pending' AND started_at IS NOT NULL AND NOT started_before;
        DROP INDEX IF EXISTS scheduled_jobs_dedupe_pending_idx;
    END IF;
END $$;

-- Scope 'pending': held while the job is pending and no attempt of it has
-- started, and while it waits claimed ahead in a worker's buffer.
CREATE UNIQUE INDEX IF NOT EXISTS scheduled_jobs_dedupe_pending_idx
    ON scheduled_jobs (dedupe_key)
    WHERE dedupe_scope = 'pending' AND NOT started_before
      AND (status = 'pending' OR (status = 'running' AND claimed_ahead));
