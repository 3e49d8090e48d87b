-- 0025: a signal can carry an idempotency key.
--
-- A sender that does not know whether its signal landed (its connection was
-- lost before the answer, a webhook delivered twice) sends it again with the
-- same key: the workflow's row lock orders the two sends, and the second
-- stores nothing (ON CONFLICT on this index). A key is unique per job; signals
-- without one (every signal sent before this migration, or by an older
-- sender) are not deduplicated. A REPLACE of the job deletes its signals, and
-- their keys with them.
ALTER TABLE workflow_signals ADD COLUMN IF NOT EXISTS idempotency_key TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS workflow_signals_key_idx
    ON workflow_signals (job_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
