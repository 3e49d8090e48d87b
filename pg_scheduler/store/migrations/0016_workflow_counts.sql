-- 0016: a parent's children counted, not rescanned; a child's outcome read
-- from its own row.
--
-- A child job that ends (completed, failed, cancelled, expired) keeps its
-- outcome on its own row, as every job does. Its parent reads it from there
-- (store/workflow_sql.py: the run's load and the children's wait join the
-- child's row to its spawn step). The end itself writes nothing on the
-- parent's spawn step any more: it only counts down the parent's wait_left,
-- when the parent is parked waiting for it, and wakes the parent at zero.
-- One locked row and one small update per child, whatever the number of
-- siblings (the earlier check looked for any sibling still waiting: a scan
-- that grew with the family).
--
-- A child's outcome is copied onto its spawn step only when the row is about
-- to lose it: the row deleted (retention, delete-on-complete, by hand) or
-- taken out of its final status (a manual retry, a REPLACE). The parent then
-- reads the copy, so a replay of the parent always sees the first outcome.
-- A spawn step's status says where its outcome is: 'waiting', on the child's
-- row (if final there; else the child has not ended); 'completed', copied.

ALTER TABLE scheduled_jobs ADD COLUMN IF NOT EXISTS wait_left INTEGER;
-- The index of the check it replaces (spawn steps now stay 'waiting' while
-- their outcome is on the child's row: it would only grow).
DROP INDEX IF EXISTS workflow_steps_waiting_idx;

-- A job reached a final status (UPDATE, OLD not final), left one (UPDATE, OLD
-- final: a retry or REPLACE of an ended child), or was deleted. As a parent
-- that ended: its unfinished children are cancelled. As a child: its end
-- counts down a parent parked waiting for it; an outcome about to be lost is
-- copied onto the parent's spawn step first. The parent's row is locked
-- first: a parent parking holds that lock until its choice (wait, or go on) is
-- committed, and each statement here reads afresh, so a wake-up is never lost
-- between the two.
CREATE OR REPLACE FUNCTION pg_scheduler_workflow_job_done() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    child RECORD;
    parent RECORD;
    was_final BOOLEAN := OLD.status IN ('completed', 'failed', 'cancelled', 'expired');
    outcome JSONB;
    left_now INTEGER;
BEGIN
    child := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    IF NOT was_final AND child.has_children THEN
        PERFORM pg_scheduler_workflow_cancel_children(
            child.job_id,
            format('cancelled: its parent job %s ended (%s)', child.job_id,
                   CASE WHEN TG_OP = 'DELETE' THEN 'deleted' ELSE NEW.status END));
    END IF;
    IF child.parent_job_id IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT j.job_id, j.status, j.wait_kind, j.wait_children, j.queue INTO parent
      FROM scheduled_jobs j WHERE j.job_id = child.parent_job_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' OR was_final THEN
        -- The row loses its outcome: keep it on the spawn step (the first one
        -- written there stays).
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
         WHERE s.job_id = parent.job_id AND s.seq = child.parent_seq
           AND s.status = 'waiting' AND s.kind = 'spawn'
           AND s.result ->> 'job_id' = child.job_id;
    END IF;
    IF was_final THEN
        RETURN NULL;  -- its end was counted when it happened
    END IF;
    -- Pending too: a parent parked with its deadline near is pending, due then.
    IF parent.status IN ('waiting', 'pending') AND parent.wait_kind = 'children'
       AND child.parent_seq <@ parent.wait_children THEN
        UPDATE scheduled_jobs j
           SET wait_left = coalesce(j.wait_left, 1) - 1
         WHERE j.job_id = parent.job_id
        RETURNING j.wait_left INTO left_now;
        -- (A count missing, which no park leaves: the first end wakes the
        -- parent, which looks for itself and parks again if it must.)
        IF left_now <= 0 THEN
            UPDATE scheduled_jobs
               SET status = 'pending', execution_time = now(), wait_kind = NULL,
                   wait_for = NULL, wake_at = NULL, wait_seq = NULL, wait_children = NULL,
                   wait_left = NULL
             WHERE job_id = parent.job_id;
            PERFORM pg_notify(CASE WHEN current_schema() = 'public' THEN 'pg_scheduler_jobs'
                                   ELSE 'pg_scheduler_jobs:' || current_schema() END,
                              CASE WHEN parent.queue = 'default' THEN ''
                                   ELSE parent.queue END);
        END IF;
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

-- Rows parked on children before this migration were counted by the old
-- check: give them their count now.
UPDATE scheduled_jobs j
   SET wait_left = (
       SELECT count(*) FROM workflow_steps s
        WHERE s.job_id = j.job_id AND s.kind = 'spawn' AND s.status = 'waiting'
          AND s.seq >= lower(j.wait_children) AND s.seq < upper(j.wait_children))
 WHERE j.wait_kind = 'children' AND j.wait_left IS NULL;
