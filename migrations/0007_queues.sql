-- 0007: named queues (issue 13).

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


-- Job events name the job's queue: each item is [job_id, task, attempt,
-- worker_id, progress, queue] (0006's five, and the queue last, so a reader of
-- the five still works). The function as 0006 wrote it otherwise.
CREATE OR REPLACE FUNCTION pg_scheduler_job_events() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    chan TEXT := CASE WHEN TG_TABLE_SCHEMA = 'public' THEN 'pg_scheduler_events'
                      ELSE 'pg_scheduler_events:' || TG_TABLE_SCHEMA END;
    wanted TEXT[];
BEGIN
    SELECT coalesce(array_agg(kind), '{}') INTO wanted
      FROM scheduler_event_flags WHERE until > now();
    IF TG_OP = 'INSERT' THEN
        IF cardinality(wanted) = 0 THEN
            RETURN NULL;
        END IF;
        PERFORM pg_notify(chan, format('{"k":"%s","t":%s,"j":[%s]}', e.kind,
                                       extract(epoch FROM now()), string_agg(e.item, ',')))
           FROM (SELECT x.kind, x.item,
                        sum(octet_length(x.item) + 1) OVER (PARTITION BY x.kind ORDER BY x.job_id)
                            / 4500 AS chunk
                   FROM (SELECT k.kind, n.job_id,
                                json_build_array(n.job_id, n.task_name, n.attempts,
                                                 n.worker_id, NULL, n.queue)::text AS item
                           FROM new_rows n
                          CROSS JOIN LATERAL unnest(ARRAY['scheduled'] ||
                                CASE WHEN n.status = 'running' THEN ARRAY['started']
                                     ELSE '{}'::text[] END) AS k(kind)
                          WHERE k.kind = ANY(wanted)) x
                  WHERE octet_length(x.item) <= 1500) e
          GROUP BY e.kind, e.chunk;
        RETURN NULL;
    ELSIF TG_OP = 'DELETE' THEN
        -- Attempts go with their job (vacuum, delete-on-complete, by hand). Not
        -- a foreign key: that would make TRUNCATE scheduled_jobs fail, as 0.2.x
        -- users' fixtures do; the TRUNCATE trigger below empties this table.
        IF EXISTS (SELECT 1 FROM job_attempts LIMIT 1) THEN
            DELETE FROM job_attempts a USING old_rows o WHERE a.job_id = o.job_id;
        END IF;
        -- A running row deleted is a completion (vacuum trigger "immediate").
        PERFORM pg_notify(chan, format('{"k":"completed","t":%s,"j":[%s]}',
                                       extract(epoch FROM now()), string_agg(e.item, ',')))
           FROM (SELECT x.item,
                        sum(octet_length(x.item) + 1) OVER (ORDER BY x.job_id) / 4500 AS chunk
                   FROM (SELECT o.job_id,
                                json_build_array(o.job_id, o.task_name, o.attempts,
                                                 o.worker_id, NULL, o.queue)::text AS item
                           FROM old_rows o WHERE o.status = 'running') x
                  WHERE octet_length(x.item) <= 1500) e
          GROUP BY e.chunk;
        RETURN NULL;
    END IF;
    PERFORM pg_notify(chan, format('{"k":"%s","t":%s,"j":[%s]}', e.kind,
                                   extract(epoch FROM now()), string_agg(e.item, ',')))
       FROM (SELECT x.kind, x.item,
                    sum(octet_length(x.item) + 1) OVER (PARTITION BY x.kind ORDER BY x.job_id)
                        / 4500 AS chunk
               FROM (SELECT CASE
                              WHEN n.status = o.status THEN
                                  CASE WHEN n.status = 'running'
                                            AND n.progress_at IS DISTINCT FROM o.progress_at
                                       THEN 'progress' END
                              WHEN n.status IN ('completed', 'failed', 'cancelled', 'expired')
                                  THEN n.status
                              WHEN n.status = 'running' THEN 'started'
                              WHEN o.status <> 'running' THEN 'scheduled'
                              WHEN n.retry_count > o.retry_count THEN 'retried'
                              WHEN n.rescue_count > o.rescue_count
                                   OR n.unstarted_rescues > o.unstarted_rescues THEN 'rescued'
                              ELSE 'handed_back' END AS kind,
                            n.job_id,
                            json_build_array(n.job_id, n.task_name, n.attempts, o.worker_id,
                                             CASE WHEN n.status = o.status
                                                  THEN n.progress END, n.queue)::text AS item
                       FROM new_rows n JOIN old_rows o ON o.job_id = n.job_id
                      -- A rescue that gives up also tells who rescued it.
                      UNION ALL
                     SELECT 'rescued', n.job_id,
                            json_build_array(n.job_id, n.task_name, n.attempts, o.worker_id,
                                             NULL, n.queue)::text
                       FROM new_rows n JOIN old_rows o ON o.job_id = n.job_id
                      WHERE n.status = 'failed' AND o.status = 'running'
                        AND n.rescue_count + n.unstarted_rescues
                            > o.rescue_count + o.unstarted_rescues) x
              WHERE x.kind IS NOT NULL
                AND (x.kind NOT IN ('scheduled', 'started') OR x.kind = ANY(wanted))
                AND octet_length(x.item) <= 1500) e
      GROUP BY e.kind, e.chunk;
    RETURN NULL;
END $$;
