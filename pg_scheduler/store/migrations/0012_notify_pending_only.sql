-- 0012: the wake-up trigger notifies only for rows inserted pending.
--
-- A row inserted already running (the in-process start, engine/local.py) is
-- started by the process that wrote it: the NOTIFY 0007's function sent for
-- it woke every worker's claim loop into a claim and a next-due probe that
-- found nothing, on the server and in each worker, at the moment the job
-- starts. Rows 0.2.x and every other path insert are pending (or NULL, the
-- column's 0.2.x default), and still wake the workers of their queue.
CREATE OR REPLACE FUNCTION pg_scheduler_notify_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    chan TEXT := CASE WHEN TG_TABLE_SCHEMA = 'public' THEN 'pg_scheduler_jobs'
                      ELSE 'pg_scheduler_jobs:' || TG_TABLE_SCHEMA END;
BEGIN
    PERFORM pg_notify(chan, CASE WHEN q.queue = 'default' THEN '' ELSE q.queue END)
       FROM (SELECT DISTINCT n.queue FROM new_rows n
              WHERE coalesce(n.status, 'pending') = 'pending') q;
    RETURN NULL;
END $$;
