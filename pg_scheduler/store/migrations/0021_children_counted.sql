-- 0021: what a completion statement does beside its rows, made cheaper.
--
-- * Children: each parent counted down once per statement, not once per child
--   (below).
-- * The transaction marked before the rows are written, so that the row
--   triggers skip what the statement's own calls do (pg_scheduler_completing).
-- * The triggers' test of that mark no longer reads an unset setting as NULL
--   (which skipped them on a connection that never ran this version).
-- * Released dependencies' edges found through their key, not by a scan.
-- * job_dependencies keeps room on its pages for its one update per edge.
--
-- Until now every child's end ran the row trigger of 0016, which updated its
-- parent's workflow_waits row: a fan-out of 10,000 children made 10,000
-- updates of one row, each a trigger call, and every completion batch held
-- that row's lock for the rest of its transaction. The statements that
-- complete running jobs (store/job_sql.py, the same ones that release
-- dependencies at once, 0015) now hand their children to
-- pg_scheduler_children_completed: per parent, in job_id order, one update of
-- its row by how many of them the park waits on, and the wake at zero. The
-- row trigger leaves such rows alone (a transaction setting, as for
-- dependencies); a statement of an earlier version, which does not call the
-- function, still has its rows counted by the trigger.
--
-- The lock that loses no wake-up (0016) is unchanged: the count is taken
-- against the parent's row as locked, whatever its park was when the
-- statement began, and the row is locked whether or not a child counts.

-- ``seqs``: the spawn steps of children of ``parent`` that just ended. Locks
-- the parent's row, counts down those its park waits on, wakes it at zero.
CREATE OR REPLACE FUNCTION pg_scheduler_workflow_children_ended(parent TEXT, seqs INTEGER[])
RETURNS VOID
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    counted INTEGER;
    left_now INTEGER;
    parent_queue TEXT;
BEGIN
    UPDATE workflow_waits w
       SET wait_left = w.wait_left - (SELECT count(*) FROM unnest(seqs) AS s(seq)
                                       WHERE s.seq >= w.wait_from AND s.seq < w.wait_to)
     WHERE w.job_id = parent
    RETURNING w.wait_left,
              (SELECT count(*) FROM unnest(seqs) AS s(seq)
                WHERE s.seq >= w.wait_from AND s.seq < w.wait_to)
         INTO left_now, counted;
    IF counted > 0 AND left_now <= 0 THEN
        UPDATE workflow_waits
           SET wait_from = NULL, wait_to = NULL, wait_left = NULL
         WHERE job_id = parent;
        -- Pending too: a parent parked with its deadline near is pending, due then.
        UPDATE scheduled_jobs
           SET status = 'pending', execution_time = now(), wait_kind = NULL,
               wait_for = NULL, wake_at = NULL, wait_seq = NULL, wait_children = NULL
         WHERE job_id = parent AND status IN ('waiting', 'pending')
           AND wait_kind = 'children'
        RETURNING queue INTO parent_queue;
        IF FOUND THEN
            PERFORM pg_notify(
                CASE WHEN current_schema() = 'public' THEN 'pg_scheduler_jobs'
                     ELSE 'pg_scheduler_jobs:' || current_schema() END,
                CASE WHEN parent_queue = 'default' THEN '' ELSE parent_queue END);
        END IF;
    END IF;
END $$;

-- Children (``parents[i]``'s spawn step ``seqs[i]``) that a statement just
-- took from running to completed: each parent counted down once, in job_id
-- order. Marks the transaction so that the row trigger skips them.
CREATE OR REPLACE FUNCTION pg_scheduler_children_completed(parents TEXT[], seqs INTEGER[])
RETURNS INTEGER
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    parent TEXT;
    its_seqs INTEGER[];
    n INTEGER := 0;
BEGIN
    PERFORM set_config('pg_scheduler.children_counted', 'on', true);
    FOR parent, its_seqs IN
        SELECT e.parent, array_agg(e.seq) FROM unnest(parents, seqs) AS e(parent, seq)
         GROUP BY e.parent ORDER BY e.parent
    LOOP
        PERFORM pg_scheduler_workflow_children_ended(parent, its_seqs);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- 0016's trigger function, its countdown now the function above, and not for
-- a running -> completed row in a transaction where
-- pg_scheduler_children_completed ran (it counted that row).
CREATE OR REPLACE FUNCTION pg_scheduler_workflow_job_done() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    child RECORD;
    was_final BOOLEAN := OLD.status IN ('completed', 'failed', 'cancelled', 'expired');
    outcome JSONB;
BEGIN
    IF TG_OP = 'DELETE' THEN
        child := OLD;
    ELSE
        child := NEW;
    END IF;
    IF NOT was_final AND child.has_children THEN
        PERFORM pg_scheduler_workflow_cancel_children(
            child.job_id,
            format('cancelled: its parent job %s ended (%s)', child.job_id,
                   CASE WHEN TG_OP = 'DELETE' THEN 'deleted' ELSE NEW.status END));
    END IF;
    IF child.parent_job_id IS NULL THEN
        RETURN NULL;
    END IF;
    IF NOT was_final
       AND NOT (TG_OP = 'UPDATE' AND OLD.status = 'running' AND NEW.status = 'completed'
                AND coalesce(current_setting('pg_scheduler.children_counted', true), '') = 'on')
    THEN
        PERFORM pg_scheduler_workflow_children_ended(child.parent_job_id,
                                                     ARRAY[child.parent_seq]);
    END IF;
    IF TG_OP = 'DELETE' OR was_final THEN
        -- The row loses its outcome: keep it on the spawn step (the first one
        -- copied there stays).
        outcome := CASE
            WHEN was_final THEN jsonb_build_object('status', OLD.status, 'result', OLD.result,
                                                   'error', OLD.error_message)
            -- A running row deleted is a completion that deletes its row
            -- (vacuum trigger IMMEDIATE): its result was not kept.
            WHEN OLD.status = 'running' THEN jsonb_build_object('status', 'completed',
                                                                'result', NULL,
                                                                'deleted', true)
            ELSE jsonb_build_object('status', 'failed',
                                    'error', 'the job was deleted before it finished')
        END;
        UPDATE workflow_steps s
           SET status = 'completed', finished_at = coalesce(OLD.finished_at, now()),
               result = s.result || jsonb_build_object('outcome', outcome)
         WHERE s.job_id = child.parent_job_id AND s.seq = child.parent_seq
           AND s.status = 'waiting' AND s.kind = 'spawn'
           AND s.result ->> 'job_id' = child.job_id;
    END IF;
    RETURN NULL;
END $$;

-- The trigger is not even called for a child that is not a parent and was
-- counted by its statement. (coalesce: in a session that never set the
-- setting it is NULL, and NOT (... AND NULL) would skip every row.)
DROP TRIGGER IF EXISTS scheduled_jobs_workflow_done ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_workflow_done
    AFTER UPDATE OF status ON scheduled_jobs FOR EACH ROW
    WHEN ((NEW.has_children
           OR (NEW.parent_job_id IS NOT NULL
               AND NOT (OLD.status = 'running' AND NEW.status = 'completed'
                        AND coalesce(current_setting('pg_scheduler.children_counted', true),
                                     '') = 'on')))
          AND NEW.status IN ('completed', 'failed', 'cancelled', 'expired')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled', 'expired'))
    EXECUTE FUNCTION pg_scheduler_workflow_job_done();

-- Called first by the statements that complete running jobs (a one-time
-- filter, before any row is written): the row triggers' WHEN clauses are
-- evaluated as each row is written, so the transaction must be marked before
-- then for them to leave the statement's dependencies (0015) and children
-- (above) to its own set-based calls. Those calls mark it too, but only once
-- the statement's rows are all written: too late to skip the trigger calls.
CREATE OR REPLACE FUNCTION pg_scheduler_completing() RETURNS BOOLEAN
LANGUAGE sql AS $$
    SELECT set_config('pg_scheduler.dependencies_released', 'on', true) = 'on'
       AND set_config('pg_scheduler.children_counted', 'on', true) = 'on'
$$;

-- 0015's set-based release, its edges found through their primary key. It
-- joined the edges to unnest(ids) by hash, which read every edge not yet met
-- (job_dependencies in full, on every completion batch that had dependents):
-- 1.3 ms a batch at 10,000 edges, growing with the graphs held. ``= ANY``
-- on the key's first column is one index descent per id.
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
    -- The row trigger leaves this transaction's running -> completed rows to
    -- this function (pg_scheduler_completing() marked it before they were
    -- written; a statement of an earlier version, which does not, still has
    -- them released by the trigger).
    PERFORM set_config('pg_scheduler.dependencies_released', 'on', true);
    WITH marked AS (
        UPDATE job_dependencies e
           SET status = 'completed', met = true, result = s.result
          FROM scheduled_jobs s
         WHERE e.depends_on = ANY(ids) AND NOT e.met
           AND s.job_id = e.depends_on
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

-- 0015's trigger had that NULL: in a session where the setting was never set
-- (a statement of an earlier version, an UPDATE by hand), a running job set
-- to completed released none of its dependents.
DROP TRIGGER IF EXISTS scheduled_jobs_dependency_done ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_dependency_done
    AFTER UPDATE OF status ON scheduled_jobs FOR EACH ROW
    WHEN (NEW.has_dependents
          AND NEW.status IN ('completed', 'failed', 'cancelled', 'expired')
          AND OLD.status IS DISTINCT FROM NEW.status
          AND NOT (OLD.status = 'running' AND NEW.status = 'completed'
                   AND coalesce(current_setting('pg_scheduler.dependencies_released', true),
                                '') = 'on'))
    EXECUTE FUNCTION pg_scheduler_dependency_done();

-- Each edge is updated once, when its dependency ends (met, status, result:
-- no indexed column). With room left on its page the update is HOT: no new
-- entry in either index of the table. New pages keep half their room for it.
ALTER TABLE job_dependencies SET (fillfactor = 50);
