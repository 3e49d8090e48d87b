-- 0007: named queues.

-- Every job belongs to one queue; rows written before this migration, and by
-- 0.2.x code that does not name one, land in "default". A constant default:
-- adding the column rewrites nothing.
ALTER TABLE scheduled_jobs
    ADD COLUMN IF NOT EXISTS queue TEXT NOT NULL DEFAULT 'default';

-- What operators set per queue. A queue needs no row here to be used: a row
-- appears when a queue is paused (or configured). Claims skip paused queues.
CREATE TABLE IF NOT EXISTS scheduler_queues (
    name       TEXT PRIMARY KEY,
    paused     BOOLEAN NOT NULL DEFAULT false,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- Every claim reads it: readable by any role, so the grants a worker already
-- has keep working (it holds queue names and pause flags only). Pausing and
-- resuming need INSERT, UPDATE, granted like any other table.
GRANT SELECT ON scheduler_queues TO PUBLIC;

-- The claim index, rebuilt to lead with the queue and the task: a claim and
-- the next-due probe visit only the (queue, task, priority) groups this worker
-- serves, found by a skip scan over this index, so due rows of other queues or
-- of tasks no worker here runs cost a claim one index descent per group, not
-- one read per row. It replaces 0001's (priority, execution_time) index under
-- the same name: no extra index on the write path.
DROP INDEX IF EXISTS scheduled_jobs_claim_idx;
CREATE INDEX IF NOT EXISTS scheduled_jobs_claim_idx
    ON scheduled_jobs (queue, task_name, priority, execution_time) WHERE status = 'pending';

-- Wake-ups name the queue: a job insert notifies once per distinct queue of
-- its rows, with the queue as the payload ('' for "default", as 0.2.x and the
-- earlier migrations sent for every insert), and a worker wakes only for
-- queues it serves. '*' (hand-backs, rescues, retries) wakes every worker.
CREATE OR REPLACE FUNCTION pg_scheduler_notify_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    chan TEXT := CASE WHEN TG_TABLE_SCHEMA = 'public' THEN 'pg_scheduler_jobs'
                      ELSE 'pg_scheduler_jobs:' || TG_TABLE_SCHEMA END;
BEGIN
    PERFORM pg_notify(chan, CASE WHEN q.queue = 'default' THEN '' ELSE q.queue END)
       FROM (SELECT DISTINCT n.queue FROM new_rows n) q;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS scheduled_jobs_notify_insert ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_notify_insert
    AFTER INSERT ON scheduled_jobs REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_notify_jobs();

-- Job events name the job's queue as a sixth item element ([job_id, task,
-- attempt, worker_id, progress, queue]; a reader of the first five still
-- works): the statements send them, and 0010 redefines the trigger function.
