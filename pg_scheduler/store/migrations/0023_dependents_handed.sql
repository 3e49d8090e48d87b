-- 0023: a completion starts the dependents it releases on its own worker.
--
-- Until now the last dependency's completion made its dependent pending and
-- sent a NOTIFY; a claim then took it, a round trip later at best, and under
-- load behind every other claim. A completion statement of a worker that can
-- run the dependent now writes it running for that worker in the same
-- statement, in the slots its completed jobs leave (at most ``room``; the
-- first ``start_now`` start at once, the rest wait in the worker's buffer,
-- claimed ahead), and returns those rows for the worker to start. A released
-- dependent is handed over only if the claim would take it here:
--
-- * due, and not past its misfire grace (a claim expires those);
-- * of a task in ``tasks`` and a queue in ``queues`` (NULL: every queue),
--   the queue not paused;
-- * bound by no global limit, and with no concurrency or fair-share key
--   (those start only through their own claims);
-- * at least as urgent as ``below``: the most urgent priority of the due
--   work the worker's plain claim would take (NULL: none is due). Equally
--   urgent work does not hold it back: a released dependent continues on
--   the worker its dependency ran on.
--
-- The rest are released as before: pending, with one NOTIFY per queue.
-- pg_scheduler_dependencies_completed (0021) stays for the statements that
-- do not hand over (and for workers of an earlier version).
CREATE OR REPLACE FUNCTION pg_scheduler_dependencies_handed(
    ids TEXT[], worker TEXT, lease DOUBLE PRECISION, tasks TEXT[], queues TEXT[],
    room INTEGER, start_now INTEGER, below INTEGER)
RETURNS TABLE (job_id TEXT, job_name TEXT, task_name TEXT, queue TEXT, task_data TEXT,
               priority INTEGER, execution_time TIMESTAMPTZ, status TEXT, attempts INTEGER,
               retry_count INTEGER, max_retries INTEGER, timeout DOUBLE PRECISION,
               retry_policy TEXT, claimed_ahead BOOLEAN, has_dependents BOOLEAN)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    schema_suffix TEXT := CASE WHEN current_schema() = 'public' THEN ''
                               ELSE ':' || current_schema() END;
    dependents TEXT[];
    counts INTEGER[];
BEGIN
    -- As pg_scheduler_dependencies_completed: the row trigger leaves this
    -- transaction's running -> completed rows to this function.
    PERFORM set_config('pg_scheduler.dependencies_released', 'on', true);
    WITH marked AS (
        UPDATE job_dependencies e
           SET status = 'completed', met = true, result = s.result
          FROM scheduled_jobs s
         WHERE e.depends_on = ANY(ids) AND NOT e.met
           AND s.job_id = e.depends_on
           AND (s.status = 'completed') IS TRUE
        RETURNING e.job_id
    )
    SELECT array_agg(g.job_id ORDER BY g.job_id), array_agg(g.n ORDER BY g.job_id)
      INTO dependents, counts
      FROM (SELECT m.job_id, count(*)::int AS n FROM marked m GROUP BY m.job_id) g;
    IF dependents IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH chosen AS (
        -- Read before the rows are locked: the update below hands over only
        -- rows it releases itself (the count as locked), so a dependent
        -- another transaction released meanwhile is left pending.
        SELECT j.job_id AS id,
               row_number() OVER (ORDER BY j.priority, j.execution_time, j.job_id) AS place
          FROM unnest(dependents, counts) AS c(job_id, n)
          JOIN scheduled_jobs j ON j.job_id = c.job_id
         WHERE room > 0
           AND (j.status = 'waiting' AND j.wait_kind = 'dependencies') IS TRUE
           AND j.dependencies_unmet <= c.n
           AND j.execution_time <= now()
           AND (j.misfire_grace_time IS NULL
                OR j.execution_time + make_interval(secs => j.misfire_grace_time) >= now())
           AND j.task_name = ANY(tasks)
           AND (queues IS NULL OR j.queue = ANY(queues))
           AND j.concurrency_key IS NULL AND j.fair_share_key IS NULL
           AND (below IS NULL OR j.priority <= below)
           AND NOT EXISTS (SELECT 1 FROM scheduler_queues q WHERE q.name = j.queue AND q.paused)
           AND NOT EXISTS (SELECT 1 FROM scheduler_limits l
                            WHERE (l.scope = 'task' AND l.name = j.task_name)
                               OR (l.scope = 'queue' AND l.name = j.queue))
         ORDER BY j.priority, j.execution_time, j.job_id
         LIMIT greatest(room, 0)
    ), released AS (
        UPDATE scheduled_jobs j
           SET dependencies_unmet = j.dependencies_unmet - c.n,
               status = CASE WHEN j.dependencies_unmet > c.n THEN 'waiting'
                             WHEN h.id IS NOT NULL THEN 'running'
                             ELSE 'pending' END,
               wait_kind = CASE WHEN j.dependencies_unmet <= c.n THEN NULL
                                ELSE 'dependencies' END,
               execution_time = CASE WHEN j.dependencies_unmet <= c.n
                                     THEN greatest(j.execution_time, now())
                                     ELSE j.execution_time END,
               worker_id = CASE WHEN h.id IS NOT NULL AND j.dependencies_unmet <= c.n
                                THEN worker ELSE j.worker_id END,
               attempts = j.attempts + CASE WHEN h.id IS NOT NULL
                                             AND j.dependencies_unmet <= c.n
                                            THEN 1 ELSE 0 END,
               started_at = CASE WHEN h.id IS NOT NULL AND j.dependencies_unmet <= c.n
                                 THEN now() ELSE j.started_at END,
               last_heartbeat = CASE WHEN h.id IS NOT NULL AND j.dependencies_unmet <= c.n
                                     THEN now() ELSE j.last_heartbeat END,
               lease_until = CASE WHEN h.id IS NOT NULL AND j.dependencies_unmet <= c.n
                                  THEN now() + make_interval(secs => lease)
                                  ELSE j.lease_until END,
               claimed_ahead = CASE WHEN h.id IS NOT NULL AND j.dependencies_unmet <= c.n
                                    THEN h.place > start_now ELSE j.claimed_ahead END
          FROM unnest(dependents, counts) AS c(job_id, n)
          LEFT JOIN chosen h ON h.id = c.job_id
         WHERE j.job_id = c.job_id
           AND (j.status = 'waiting' AND j.wait_kind = 'dependencies') IS TRUE
        RETURNING j.job_id, j.job_name, j.task_name, j.queue, j.task_data::text AS task_data,
                  j.priority, j.execution_time, j.status, j.attempts, j.retry_count,
                  j.max_retries, j.timeout, j.retry_policy::text AS retry_policy,
                  j.claimed_ahead, j.has_dependents
    ), notified AS (
        -- One NOTIFY per queue of the rows left pending (for any worker).
        SELECT count(pg_notify('pg_scheduler_jobs' || schema_suffix,
                               CASE WHEN q.queue = 'default' THEN '' ELSE q.queue END)) AS n
          FROM (SELECT DISTINCT r.queue FROM released r WHERE r.status = 'pending') q
    )
    SELECT r.job_id, r.job_name, r.task_name, r.queue, r.task_data, r.priority,
           r.execution_time, r.status, r.attempts, r.retry_count, r.max_retries, r.timeout,
           r.retry_policy, r.claimed_ahead, r.has_dependents
      FROM released r, notified
     WHERE r.status = 'running';
END $$;
