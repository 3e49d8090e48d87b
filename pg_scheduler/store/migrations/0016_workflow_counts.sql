-- 0016: a parent's children counted down on a narrow row of their own; a
-- child's outcome read from its own row.
--
-- A child job that ends (completed, failed, cancelled, expired) keeps its
-- outcome on its own row, as every job does. Its parent reads it from there
-- (store/workflow_sql.py: the run's load and the children's wait join the
-- child's row to its spawn step). The end writes nothing on the parent: it
-- counts down workflow_waits.wait_left of its parent (one narrow row per
-- workflow that spawned, updated in place) when the parent is parked waiting
-- for it, and wakes the parent at zero. The earlier check wrote the spawn
-- step and looked for any sibling still waiting: a scan that grew with the
-- family, and a write of the wide parent row.
--
-- The narrow row is also the lock that loses no wake-up: a child's end
-- updates it (a row lock, whether or not it counts), and a parent parking on
-- children locks it before it reads its children afresh. Either the end
-- commits first and the parent sees it, or the parent parks first (setting
-- the span it waits on and how many there have not ended) and the end, which
-- waited for that lock, counts itself down.
--
-- A child's outcome is copied onto its spawn step only when the row is about
-- to lose it: the row deleted (retention, delete-on-complete, by hand) or
-- taken out of its final status (a manual retry, a REPLACE). The parent then
-- reads the copy, so a replay of the parent always sees the first outcome.
-- A spawn step's status says where its outcome is: 'waiting', on the child's
-- row (if final there; else the child has not ended); 'completed', copied.

-- A workflow that spawned: the spawn steps [wait_from, wait_to) its current
-- park on children waits on, and how many of those children have not ended
-- (NULL: not parked on children). Written in place: HOT updates, kept by the
-- low fill factor.
CREATE TABLE IF NOT EXISTS workflow_waits (
    job_id    TEXT PRIMARY KEY,
    wait_from INTEGER,
    wait_to   INTEGER,
    wait_left INTEGER
) WITH (fillfactor = 30);

-- Every workflow that spawned already has its row, and one parked on
-- children its count (the old check's statuses: a spawn step still waiting
-- is a child not ended).
INSERT INTO workflow_waits (job_id, wait_from, wait_to, wait_left)
SELECT j.job_id,
       CASE WHEN j.wait_kind = 'children' THEN lower(j.wait_children) END,
       CASE WHEN j.wait_kind = 'children' THEN upper(j.wait_children) END,
       CASE WHEN j.wait_kind = 'children' THEN (
           SELECT count(*) FROM workflow_steps s
            WHERE s.job_id = j.job_id AND s.kind = 'spawn' AND s.status = 'waiting'
              AND s.seq >= lower(j.wait_children) AND s.seq < upper(j.wait_children))
       END
  FROM scheduled_jobs j
 WHERE j.has_children
ON CONFLICT (job_id) DO NOTHING;

-- The index of the check this replaces (spawn steps now stay 'waiting' while
-- their outcome is on the child's row: it would only grow).
DROP INDEX IF EXISTS workflow_steps_waiting_idx;

-- A job reached a final status (UPDATE, OLD not final), left one (UPDATE, OLD
-- final: a retry or REPLACE of an ended child), or was deleted. As a parent
-- that ended: its unfinished children are cancelled. As a child: its end
-- counts down a parent parked waiting for it; an outcome about to be lost is
-- copied onto the parent's spawn step.
CREATE OR REPLACE FUNCTION pg_scheduler_workflow_job_done() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    child RECORD;
    was_final BOOLEAN := OLD.status IN ('completed', 'failed', 'cancelled', 'expired');
    counted BOOLEAN;
    left_now INTEGER;
    parent_queue TEXT;
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
    IF NOT was_final THEN
        -- Its end: the parent's row locked (see above), counted if the
        -- parent is parked on it.
        UPDATE workflow_waits w
           SET wait_left = CASE WHEN child.parent_seq >= w.wait_from
                                     AND child.parent_seq < w.wait_to
                                THEN w.wait_left - 1 ELSE w.wait_left END
         WHERE w.job_id = child.parent_job_id
        RETURNING w.wait_left,
                  child.parent_seq >= w.wait_from AND child.parent_seq < w.wait_to
             INTO left_now, counted;
        IF counted AND left_now <= 0 THEN
            UPDATE workflow_waits
               SET wait_from = NULL, wait_to = NULL, wait_left = NULL
             WHERE job_id = child.parent_job_id;
            -- Pending too: a parent parked with its deadline near is pending, due then.
            UPDATE scheduled_jobs
               SET status = 'pending', execution_time = now(), wait_kind = NULL,
                   wait_for = NULL, wake_at = NULL, wait_seq = NULL, wait_children = NULL
             WHERE job_id = child.parent_job_id AND status IN ('waiting', 'pending')
               AND wait_kind = 'children'
            RETURNING queue INTO parent_queue;
            IF FOUND THEN
                PERFORM pg_notify(
                    CASE WHEN current_schema() = 'public' THEN 'pg_scheduler_jobs'
                         ELSE 'pg_scheduler_jobs:' || current_schema() END,
                    CASE WHEN parent_queue = 'default' THEN '' ELSE parent_queue END);
            END IF;
        END IF;
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

-- A child taken out of its final status (a manual retry, a REPLACE): its
-- outcome is copied first, as above.
DROP TRIGGER IF EXISTS scheduled_jobs_workflow_reopened ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_workflow_reopened
    AFTER UPDATE OF status ON scheduled_jobs FOR EACH ROW
    WHEN (NEW.parent_job_id IS NOT NULL
          AND OLD.status IN ('completed', 'failed', 'cancelled', 'expired')
          AND NEW.status NOT IN ('completed', 'failed', 'cancelled', 'expired'))
    EXECUTE FUNCTION pg_scheduler_workflow_job_done();
-- Deleted: an unfinished job (a parent's children cancelled, a child's end
-- counted), or an ended child (its outcome copied).
DROP TRIGGER IF EXISTS scheduled_jobs_workflow_deleted ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_workflow_deleted
    AFTER DELETE ON scheduled_jobs FOR EACH ROW
    WHEN (OLD.parent_job_id IS NOT NULL
          OR (OLD.has_children
              AND OLD.status NOT IN ('completed', 'failed', 'cancelled', 'expired')))
    EXECUTE FUNCTION pg_scheduler_workflow_job_done();

-- REPLACE of a job that ran makes a new job under the same id (0014): its
-- count goes with the old run's steps and signals.
CREATE OR REPLACE FUNCTION pg_scheduler_workflow_replaced() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF OLD.has_children THEN
        PERFORM pg_scheduler_workflow_cancel_children(
            OLD.job_id, format('cancelled: its parent job %s was replaced', OLD.job_id));
    END IF;
    DELETE FROM workflow_steps WHERE job_id = OLD.job_id;
    DELETE FROM workflow_signals WHERE job_id = OLD.job_id;
    DELETE FROM workflow_waits WHERE job_id = OLD.job_id;
    IF NEW.wait_kind IS NOT NULL OR NEW.has_children OR NEW.workflow_deadline IS NOT NULL THEN
        UPDATE scheduled_jobs
           SET wait_kind = NULL, wait_for = NULL, wake_at = NULL, wait_seq = NULL,
               wait_children = NULL, workflow_deadline = NULL, has_children = false
         WHERE job_id = NEW.job_id;
    END IF;
    RETURN NULL;
END $$;

-- Steps, signals and counts go with their job (0014).
CREATE OR REPLACE FUNCTION pg_scheduler_workflow_forget() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        -- DELETE, not TRUNCATE: a TRUNCATE of several tables may name these too.
        DELETE FROM workflow_steps;
        DELETE FROM workflow_signals;
        DELETE FROM workflow_waits;
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM workflow_steps LIMIT 1) THEN
        DELETE FROM workflow_steps s USING old_rows o WHERE s.job_id = o.job_id;
    END IF;
    IF EXISTS (SELECT 1 FROM workflow_signals LIMIT 1) THEN
        DELETE FROM workflow_signals s USING old_rows o WHERE s.job_id = o.job_id;
    END IF;
    IF EXISTS (SELECT 1 FROM workflow_waits LIMIT 1) THEN
        DELETE FROM workflow_waits w USING old_rows o WHERE w.job_id = o.job_id;
    END IF;
    RETURN NULL;
END $$;
