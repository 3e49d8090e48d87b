-- 0010: job events sent by the statements that make the transitions.
--
-- 0006's statement-level UPDATE trigger captured transition tables and ran a
-- PL/pgSQL function on every claim, completion, heartbeat and lease renewal,
-- whether anyone listened or not: about a quarter of a drain's time. The
-- statements in pg_scheduler/store send the same payloads themselves now (see
-- store/event_sql.py); the engine sends the claim's. An UPDATE written by hand
-- sends no event: wait_for() sees it by its poll.
--
-- The INSERT trigger stays (it sends only while a subscriber wants
-- "scheduled" or "started"), and so does the DELETE trigger (it removes the
-- attempts of deleted jobs, and reports a running row deleted as completed
-- while someone wants "completed": see the function below).
DROP TRIGGER IF EXISTS scheduled_jobs_events_update ON scheduled_jobs;

-- The INSERT and DELETE triggers' function, without its UPDATE branch, and
-- with "completed" (a running row deleted: the completion of a worker that
-- deletes completed rows, or a vacuum) flagged like "scheduled" and
-- "started": sent only while some process waits or subscribes.
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
        -- Attempts go with their job (vacuum, delete-on-complete, by hand).
        IF EXISTS (SELECT 1 FROM job_attempts LIMIT 1) THEN
            DELETE FROM job_attempts a USING old_rows o WHERE a.job_id = o.job_id;
        END IF;
        IF NOT 'completed' = ANY(wanted) THEN
            RETURN NULL;
        END IF;
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
    END IF;
    RETURN NULL;
END $$;
