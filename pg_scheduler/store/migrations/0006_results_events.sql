-- 0006: attempt history, progress, and job events.

-- Attempts that did not complete: retried, failed, timed out, cancelled while
-- running, rescued, handed back. The running or completed attempt is the job
-- row itself, so a job that completes on its first attempt writes nothing here.
CREATE TABLE IF NOT EXISTS job_attempts (
    attempt_id  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    worker_id   TEXT,
    started_at  TIMESTAMPTZ,
    finished_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    outcome     TEXT NOT NULL CHECK (outcome IN
                    ('failed', 'timed_out', 'cancelled', 'rescued', 'handed_back')),
    error       TEXT,
    traceback   TEXT
);
-- get_job() reads one job's attempts; the cascade deletes them through it.
CREATE INDEX IF NOT EXISTS job_attempts_job_idx ON job_attempts (job_id, attempt_id);

-- The latest progress a running job reported. Nullable without a default:
-- adding them rewrites nothing.
ALTER TABLE scheduled_jobs
    ADD COLUMN IF NOT EXISTS progress         DOUBLE PRECISION,
    ADD COLUMN IF NOT EXISTS progress_message TEXT,
    ADD COLUMN IF NOT EXISTS progress_at      TIMESTAMPTZ;

-- High-volume event kinds (scheduled, started) are sent only while some
-- subscriber wants them: it keeps a row here fresh (until > now()).
CREATE TABLE IF NOT EXISTS scheduler_event_flags (
    kind  TEXT PRIMARY KEY,
    until TIMESTAMPTZ NOT NULL
);

-- Job events: one statement-level trigger per statement, never per row. Each
-- payload is {"k": kind, "t": epoch seconds, "j": [[job_id, task, attempt,
-- worker_id, progress], ...]}, split so that none exceeds about 6,000 bytes
-- (PostgreSQL refuses 8,000); a job whose id and task alone exceed 1,500
-- bytes of JSON gets no event (waiters fall back to polling).
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
                                                 n.worker_id, NULL)::text AS item
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
                                                 o.worker_id, NULL)::text AS item
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
                                                  THEN n.progress END)::text AS item
                       FROM new_rows n JOIN old_rows o ON o.job_id = n.job_id
                      -- A rescue that gives up also tells who rescued it.
                      UNION ALL
                     SELECT 'rescued', n.job_id,
                            json_build_array(n.job_id, n.task_name, n.attempts, o.worker_id,
                                             NULL)::text
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

DROP TRIGGER IF EXISTS scheduled_jobs_events_insert ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_events_insert
    AFTER INSERT ON scheduled_jobs REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_job_events();
DROP TRIGGER IF EXISTS scheduled_jobs_events_update ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_events_update
    AFTER UPDATE ON scheduled_jobs REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_job_events();
DROP TRIGGER IF EXISTS scheduled_jobs_events_delete ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_events_delete
    AFTER DELETE ON scheduled_jobs REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_job_events();

CREATE OR REPLACE FUNCTION pg_scheduler_truncate_attempts() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- DELETE, not TRUNCATE: "TRUNCATE scheduled_jobs, job_attempts" is in use here.
    DELETE FROM job_attempts;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS scheduled_jobs_truncate_attempts ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_truncate_attempts
    AFTER TRUNCATE ON scheduled_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_truncate_attempts();

-- Workers joining and leaving (the heartbeat's upsert inserts a row only once).
CREATE OR REPLACE FUNCTION pg_scheduler_worker_events() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    chan TEXT := CASE WHEN TG_TABLE_SCHEMA = 'public' THEN 'pg_scheduler_events'
                      ELSE 'pg_scheduler_events:' || TG_TABLE_SCHEMA END;
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_notify(chan, format('{"k":"worker_started","t":%s,"w":[%s]}',
                                       extract(epoch FROM now()), string_agg(w.item, ',')))
           FROM (SELECT json_build_array(n.worker_id, n.hostname, n.pid)::text AS item
                   FROM new_rows n LIMIT 50) w
         HAVING count(*) > 0;
    ELSE
        PERFORM pg_notify(chan, format('{"k":"worker_stopped","t":%s,"w":[%s]}',
                                       extract(epoch FROM now()), string_agg(w.item, ',')))
           FROM (SELECT json_build_array(o.worker_id, o.hostname, o.pid)::text AS item
                   FROM old_rows o LIMIT 50) w
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS scheduler_workers_events_insert ON scheduler_workers;
CREATE TRIGGER scheduler_workers_events_insert
    AFTER INSERT ON scheduler_workers REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_worker_events();
DROP TRIGGER IF EXISTS scheduler_workers_events_delete ON scheduler_workers;
CREATE TRIGGER scheduler_workers_events_delete
    AFTER DELETE ON scheduler_workers REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_worker_events();
