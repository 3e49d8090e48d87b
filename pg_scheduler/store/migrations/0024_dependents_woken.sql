-- 0024: the dependents a completion that hands over releases pending wake
-- their workers.
--
-- pg_scheduler_dependencies_handed (0023) sent the NOTIFY of the dependents
-- it left pending from a CTE that its final SELECT joined to the rows it
-- wrote running. A CTE that only reads is run as far as its reader asks:
-- with no row written running, that join asked nothing and no NOTIFY went
-- out. A dependent released pending by such a completion (of a queue or task
-- the completing worker does not run, keyed or fair-share, not yet due, in a
-- paused queue, under a global limit, or behind more urgent work), when none
-- of the statement's dependents was taken over, then waited for a worker's
-- poll. The NOTIFY is now computed by each row's update (RETURNING), which
-- always runs to its end; PostgreSQL sends a repeated channel and payload
-- once per transaction, so a queue is still notified once.

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
                  j.claimed_ahead, j.has_dependents,
                  -- A row left pending wakes the workers of its queue (for any
                  -- worker; one NOTIFY per queue and transaction: PostgreSQL
                  -- sends a repeated channel and payload once).
                  CASE WHEN j.status = 'pending'
                       THEN pg_notify('pg_scheduler_jobs' || schema_suffix,
                                      CASE WHEN j.queue = 'default' THEN '' ELSE j.queue END)
                  END AS woke
    )
    SELECT r.job_id, r.job_name, r.task_name, r.queue, r.task_data, r.priority,
           r.execution_time, r.status, r.attempts, r.retry_count, r.max_retries, r.timeout,
           r.retry_policy, r.claimed_ahead, r.has_dependents
      FROM released r
     WHERE r.status = 'running';
END $$;
