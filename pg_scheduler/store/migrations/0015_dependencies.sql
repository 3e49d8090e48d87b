-- 0015: declared dependencies between jobs (schedule(..., depends_on=[...])).
--
-- A job whose dependencies have not all completed is 'waiting' with
-- wait_kind 'dependencies': out of the claim index (its predicate is
-- status = 'pending'), so it costs the claim nothing, holds no worker, lease
-- or slot. dependencies_unmet counts its dependencies not yet met; when the
-- last one completes, it becomes pending (due at once, or at its own
-- execution_time if later) and its queue's workers are notified, in the same
-- transaction as that completion: the completion statements call
-- pg_scheduler_dependencies_completed for their rows, the row trigger below
-- handles every other end. No sweep, no poller.
--
-- * job_dependencies: one row per edge (depends_on -> job_id), in the order
--   the dependent declared them (ordinal), with the dependent's policy for a
--   dependency that ends without completing (on_failure: cancel, run, wait).
--   When the dependency ends, its final status is written on the edge, and
--   its result when it completed: a dependent reads its dependencies' results
--   there (current_job().dependency_results()), even after vacuum removed
--   the dependency's row. met: the edge no longer holds its dependent back
--   (the dependency completed, or it ended otherwise and the policy is run).
--   An edge goes with its dependent's row (vacuum, delete, truncate).
-- * scheduled_jobs.has_dependents: set on a job some job depends on; the
--   completion statements and the row triggers below test it, so no function
--   is called for plain jobs.
--
-- A dependency that ends without completing (failed after its last retry,
-- cancelled, expired, deleted unfinished) applies each dependent's policy:
-- cancel (recursively: every job waiting on it through cancel edges is
-- cancelled, its error naming the job that ended), run (the edge is met),
-- wait (the dependent stays waiting; a manual retry of the dependency that
-- completes meets the edge).

ALTER TABLE scheduled_jobs
    ADD COLUMN IF NOT EXISTS has_dependents BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS dependencies_unmet INTEGER;

-- The new wait kind. The check is written again (one scan of the table).
ALTER TABLE scheduled_jobs DROP CONSTRAINT IF EXISTS scheduled_jobs_wait_kind_check;
ALTER TABLE scheduled_jobs ADD CONSTRAINT scheduled_jobs_wait_kind_check CHECK (
    wait_kind IN ('sleep', 'signal', 'children', 'dependencies'));

CREATE TABLE IF NOT EXISTS job_dependencies (
    depends_on TEXT NOT NULL,
    job_id     TEXT NOT NULL,
    ordinal    INTEGER NOT NULL DEFAULT 0,
    on_failure TEXT NOT NULL DEFAULT 'cancel' CHECK (on_failure IN ('cancel', 'run', 'wait')),
    met        BOOLEAN NOT NULL DEFAULT false,
    status     TEXT,
    result     JSONB,
    PRIMARY KEY (depends_on, job_id)
);
-- A dependent's edges: its results, and the edges that go with its row.
CREATE INDEX IF NOT EXISTS job_dependencies_job_idx ON job_dependencies (job_id, ordinal);

-- Dependency ``dep`` ended with ``dep_status`` (and ``dep_result`` when it
-- completed): every edge from it not yet met records that; the dependents
-- whose policy is cancel are cancelled first, with every job waiting on them
-- through cancel edges, in one statement (so the depth of a graph is not the
-- depth of nested triggers); then each dependent whose edge is now met counts
-- one dependency fewer (an UPDATE: one that waits for the row lock of another
-- ending at once re-reads the count that one left, so the two never both
-- leave it above zero), and one with none left becomes pending and wakes its
-- queue's workers. Each statement reads the rows it changes by job_id (the
-- primary key; the status test is wrapped in IS TRUE so that the partial
-- index of waiting rows, scheduled_jobs_wake_idx, is no candidate): its cost
-- does not grow with the number of jobs waiting elsewhere. Returns how many
-- jobs it made pending.
CREATE OR REPLACE FUNCTION pg_scheduler_dependency_ended(dep TEXT, dep_status TEXT,
                                                         dep_result JSONB)
RETURNS INTEGER
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    schema_suffix TEXT := CASE WHEN current_schema() = 'public' THEN ''
                               ELSE ':' || current_schema() END;
    reason TEXT := format('cancelled: its dependency %s %s', dep,
                          CASE WHEN dep_status = 'cancelled' THEN 'was cancelled'
                               ELSE dep_status END);
    doomed TEXT[];
    dependent RECORD;
    released RECORD;
    n INTEGER := 0;
    sent_count INTEGER;
BEGIN
    IF dep_status <> 'completed' THEN
        WITH RECURSIVE closure(job_id) AS (
            SELECT e.job_id FROM job_dependencies e
             WHERE e.depends_on = dep AND NOT e.met AND e.on_failure = 'cancel'
            UNION
            SELECT e.job_id FROM closure c
              JOIN job_dependencies e ON e.depends_on = c.job_id
             WHERE NOT e.met AND e.on_failure = 'cancel'
        )
        SELECT array_agg(c.job_id ORDER BY c.job_id) INTO doomed FROM closure c;
        IF doomed IS NOT NULL THEN
            PERFORM 1 FROM scheduled_jobs j
              WHERE j.job_id = ANY(doomed)
                AND (j.status = 'waiting' AND j.wait_kind = 'dependencies') IS TRUE
              ORDER BY j.job_id
                FOR NO KEY UPDATE;
            WITH cancelled AS (
                UPDATE scheduled_jobs j
                   SET status = 'cancelled', finished_at = now(), wait_kind = NULL,
                       error_message = reason
                 WHERE j.job_id = ANY(doomed)
                   AND (j.status = 'waiting' AND j.wait_kind = 'dependencies') IS TRUE
                RETURNING j.job_id, j.task_name, j.attempts, j.queue
            )
            SELECT count(pg_notify('pg_scheduler_events' || schema_suffix,
                                   format('{"k":"cancelled","t":%s,"j":[%s]}',
                                          extract(epoch FROM now()), e.items)))
              INTO sent_count
              FROM (SELECT string_agg(json_build_array(c.job_id, c.task_name, c.attempts,
                                                       NULL, NULL, c.queue)::text, ',')
                               AS items
                      FROM (SELECT x.*, (row_number() OVER (ORDER BY x.job_id) - 1) / 20
                                           AS chunk
                              FROM cancelled x) c
                     GROUP BY c.chunk) e;
        END IF;
    END IF;
    -- Each dependent by its primary key, in job_id order (two transactions
    -- releasing the same dependents lock them in the same order).
    FOR dependent IN
        WITH marked AS (
            UPDATE job_dependencies e
               SET status = dep_status,
                   result = CASE WHEN dep_status = 'completed' THEN dep_result END,
                   met = dep_status = 'completed' OR e.on_failure = 'run'
             WHERE e.depends_on = dep AND NOT e.met
            RETURNING e.job_id, e.met
        )
        SELECT m.job_id FROM marked m WHERE m.met ORDER BY m.job_id
    LOOP
        UPDATE scheduled_jobs j
           SET dependencies_unmet = j.dependencies_unmet - 1,
               status = CASE WHEN j.dependencies_unmet <= 1 THEN 'pending' ELSE 'waiting' END,
               wait_kind = CASE WHEN j.dependencies_unmet <= 1 THEN NULL
                                ELSE 'dependencies' END,
               execution_time = CASE WHEN j.dependencies_unmet <= 1
                                     THEN greatest(j.execution_time, now())
                                     ELSE j.execution_time END
         WHERE j.job_id = dependent.job_id
           AND (j.status = 'waiting' AND j.wait_kind = 'dependencies') IS TRUE
        RETURNING j.status, j.queue INTO released;
        IF released.status = 'pending' THEN
            -- One NOTIFY per queue: PostgreSQL folds repeats within a transaction.
            PERFORM pg_notify('pg_scheduler_jobs' || schema_suffix,
                              CASE WHEN released.queue = 'default' THEN ''
                                   ELSE released.queue END);
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

-- Completions in bulk: the completion statements (store/job_sql.py) call this
-- once per statement with their completed rows that have dependents. It reads
-- each one's status and result as that statement left them (a function the
-- statement calls sees its writes so far), so only jobs really completed
-- release anything, whoever calls it. The same as pg_scheduler_dependency_ended
-- for each, set-based: the edges marked, each dependent's count lowered by the
-- number of its dependencies completed here, in job_id order, through the
-- primary key.
CREATE OR REPLACE FUNCTION pg_scheduler_dependencies_completed(ids TEXT[])
RETURNS INTEGER
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    schema_suffix TEXT := CASE WHEN current_schema() = 'public' THEN ''
                               ELSE ':' || current_schema() END;
    dependents TEXT[];
    counts INTEGER[];
    n INTEGER;
BEGIN
    -- The row trigger below leaves this transaction's running -> completed
    -- rows to this function (a statement of an earlier version, which does
    -- not call it, still has them released by the trigger).
    PERFORM set_config('pg_scheduler.dependencies_released', 'on', true);
    WITH marked AS (
        UPDATE job_dependencies e
           SET status = 'completed', met = true, result = s.result
          FROM unnest(ids) AS d(job_id)
          JOIN scheduled_jobs s ON s.job_id = d.job_id
         WHERE e.depends_on = d.job_id AND NOT e.met
           -- IS TRUE: no index led by status (scheduled_jobs_dashboard_idx) is
           -- a candidate; each row is found by its primary key.
           AND (s.status = 'completed') IS TRUE
        RETURNING e.job_id
    )
    SELECT array_agg(g.job_id ORDER BY g.job_id), array_agg(g.n ORDER BY g.job_id)
      INTO dependents, counts
      FROM (SELECT m.job_id, count(*)::int AS n FROM marked m GROUP BY m.job_id) g;
    IF dependents IS NULL THEN
        RETURN 0;
    END IF;
    WITH released AS (
        UPDATE scheduled_jobs j
           SET dependencies_unmet = j.dependencies_unmet - c.n,
               status = CASE WHEN j.dependencies_unmet <= c.n THEN 'pending' ELSE 'waiting' END,
               wait_kind = CASE WHEN j.dependencies_unmet <= c.n THEN NULL
                                ELSE 'dependencies' END,
               execution_time = CASE WHEN j.dependencies_unmet <= c.n
                                     THEN greatest(j.execution_time, now())
                                     ELSE j.execution_time END
          FROM unnest(dependents, counts) AS c(job_id, n)
         WHERE j.job_id = c.job_id
           AND (j.status = 'waiting' AND j.wait_kind = 'dependencies') IS TRUE
        RETURNING j.status, j.queue
    )
    SELECT count(pg_notify('pg_scheduler_jobs' || schema_suffix,
                           CASE WHEN q.queue = 'default' THEN '' ELSE q.queue END))
      INTO n
      FROM (SELECT DISTINCT r.queue FROM released r WHERE r.status = 'pending') q;
    RETURN n;
END $$;

-- A job some job depends on ended (or was deleted unfinished: a running row
-- deleted is a completion that deletes its row, vacuum's IMMEDIATE policy,
-- its result gone with the row; any other is counted as cancelled). Not for running ->
-- completed in a transaction where pg_scheduler_dependencies_completed ran:
-- the statements that complete running jobs call it for all their rows at
-- once (one call per statement instead of one per row); such a statement of
-- an earlier version, which does not, still has its rows released here.
CREATE OR REPLACE FUNCTION pg_scheduler_dependency_done() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_scheduler_dependency_ended(
            OLD.job_id, CASE WHEN OLD.status = 'running' THEN 'completed' ELSE 'cancelled' END,
            NULL);
    ELSE
        PERFORM pg_scheduler_dependency_ended(NEW.job_id, NEW.status, NEW.result);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS scheduled_jobs_dependency_done ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_dependency_done
    AFTER UPDATE OF status ON scheduled_jobs FOR EACH ROW
    WHEN (NEW.has_dependents
          AND NEW.status IN ('completed', 'failed', 'cancelled', 'expired')
          AND OLD.status IS DISTINCT FROM NEW.status
          AND NOT (OLD.status = 'running' AND NEW.status = 'completed'
                   AND current_setting('pg_scheduler.dependencies_released', true) = 'on'))
    EXECUTE FUNCTION pg_scheduler_dependency_done();
DROP TRIGGER IF EXISTS scheduled_jobs_dependency_deleted ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_dependency_deleted
    AFTER DELETE ON scheduled_jobs FOR EACH ROW
    WHEN (OLD.has_dependents
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled', 'expired'))
    EXECUTE FUNCTION pg_scheduler_dependency_done();

-- A dependent's edges go with its row (vacuum, delete, by hand): one check
-- per statement while no dependency was ever declared, one join otherwise.
CREATE OR REPLACE FUNCTION pg_scheduler_dependencies_forget() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM job_dependencies;
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM job_dependencies LIMIT 1) THEN
        DELETE FROM job_dependencies e USING old_rows o WHERE e.job_id = o.job_id;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS scheduled_jobs_dependencies_forget ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_dependencies_forget
    AFTER DELETE ON scheduled_jobs REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_dependencies_forget();
DROP TRIGGER IF EXISTS scheduled_jobs_dependencies_truncate ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_dependencies_truncate
    AFTER TRUNCATE ON scheduled_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_dependencies_forget();
