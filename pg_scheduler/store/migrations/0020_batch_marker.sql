-- 0020: which batch a job ran in.
--
-- A job of a batch task (docs/batches.md) shows the batch its latest batch
-- attempt ran in: one row here per call of the handler, written by the
-- worker in one statement as the batch starts, naming the jobs the handler
-- was given (job_ids) and how many (batch_size). A retry that runs in a later
-- batch is in that batch's row too; the latest row that names a job is its
-- batch. Plain jobs are in no row.
--
-- A table of its own, not columns of scheduled_jobs: a mark on the job rows
-- would write every batch job's row once more. One narrow row per batch
-- instead, and one GIN entry per job (fastupdate: appended to the index's
-- pending list, merged later in bulk) to find a job's batches. The vacuum
-- drops the rows of batches older than every job still in scheduled_jobs.
CREATE TABLE IF NOT EXISTS scheduler_batches (
    batch_id   UUID PRIMARY KEY,
    task_name  TEXT NOT NULL,
    queue      TEXT NOT NULL,
    worker_id  TEXT,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    batch_size INTEGER NOT NULL,
    job_ids    TEXT[] NOT NULL
);
CREATE INDEX IF NOT EXISTS scheduler_batches_jobs_idx
    ON scheduler_batches USING gin (job_ids) WITH (fastupdate = on);
CREATE INDEX IF NOT EXISTS scheduler_batches_started_idx
    ON scheduler_batches (started_at);
