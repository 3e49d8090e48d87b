-- 0020: which batch a job ran in.
--
-- A job of a batch task (docs/batches.md) carries the batch its latest batch
-- attempt ran in: batch_id, one id per call of the handler, and batch_size,
-- how many jobs that call was given. The worker writes both for the whole
-- batch in one statement as the batch starts; a retry that runs in a later
-- batch takes that batch's id. Plain jobs keep NULL.
--
-- Nullable, without a default and in no index: adding them rewrites nothing,
-- and the write that sets them changes no indexed column (a HOT update where
-- the row's page has room).
ALTER TABLE scheduled_jobs
    ADD COLUMN IF NOT EXISTS batch_id   UUID,
    ADD COLUMN IF NOT EXISTS batch_size INTEGER;
