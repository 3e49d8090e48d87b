-- 0014: durable workflows (pg_scheduler/workflows/).
--
-- A workflow is a job like any other: a row of scheduled_jobs, claimed,
-- leased, heartbeated and rescued as every job is. What it adds:
--
-- * workflow_steps: the checkpoints of its steps, numbered in the order the
--   workflow reached them (seq) and named (name, key); a run of the workflow
--   returns recorded results instead of running those steps again.
-- * workflow_signals: signals sent to a workflow, kept until a wait takes them.
-- * status 'waiting': a workflow parked (sleeping, waiting for a signal or for
--   its children). No worker, no lease, no slot. What it waits for is on its
--   row (wait_kind, wait_for, wake_at, wait_seq, wait_children); whatever
--   releases it (a signal, its last awaited child ending, the timer service)
--   makes it pending in the same transaction, with a NOTIFY.
-- * children: a job spawned by a workflow step names its parent
--   (parent_job_id, parent_seq: the spawn step); when it ends, its outcome is
--   written on that step, and a parent waiting for it is woken. A parent that
--   ends cancels its unfinished children (those not spawned detached).
--
-- No foreign keys: "TRUNCATE scheduled_jobs" (0.2.x fixtures) must keep
-- working, and a key would make every delete of a plain job look for steps.
-- Steps and signals go with their job by trigger, like job_attempts (0006).
--
-- Plain jobs pay nothing: the new columns are NULL or false on their rows
-- (constant defaults: adding them rewrites nothing), the row triggers below
-- test them in their WHEN clause (evaluated without calling any function),
-- and the statements of the plain job path are unchanged.

ALTER TABLE scheduled_jobs
    ADD COLUMN IF NOT EXISTS parent_job_id TEXT,
    ADD COLUMN IF NOT EXISTS parent_seq INTEGER,
    ADD COLUMN IF NOT EXISTS has_children BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS wait_kind TEXT,
    ADD COLUMN IF NOT EXISTS wait_for TEXT,
    ADD COLUMN IF NOT EXISTS wake_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS wait_seq INTEGER,
    ADD COLUMN IF NOT EXISTS wait_children INT4RANGE,
    ADD COLUMN IF NOT EXISTS workflow_deadline TIMESTAMPTZ;

-- The new status. The check is written again (one scan of the table).
ALTER TABLE scheduled_jobs DROP CONSTRAINT IF EXISTS scheduled_jobs_status_check;
ALTER TABLE scheduled_jobs ADD CONSTRAINT scheduled_jobs_status_check CHECK (
    status IN ('pending', 'running', 'waiting', 'completed', 'failed', 'cancelled', 'expired'));
ALTER TABLE scheduled_jobs DROP CONSTRAINT IF EXISTS scheduled_jobs_wait_kind_check;
ALTER TABLE scheduled_jobs ADD CONSTRAINT scheduled_jobs_wait_kind_check CHECK (
    wait_kind IN ('sleep', 'signal', 'children'));

-- The timer service's read: parked rows by wake time (sleeps, signal timeouts,
-- workflow deadlines). Only parked rows are in it.
CREATE INDEX IF NOT EXISTS scheduled_jobs_wake_idx
    ON scheduled_jobs (wake_at) WHERE status = 'waiting';

-- A dedupe key of scope 'active' is held while the job is pending, running
-- or parked: a workflow waiting for a signal is still under way. Rebuilt only
-- while it has 0008's predicate (a re-application leaves it alone).
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_index i
         WHERE i.indexrelid = to_regclass('scheduled_jobs_dedupe_active_idx')
           AND pg_get_expr(i.indpred, i.indrelid) LIKE '%waiting%'
    ) THEN
        DROP INDEX IF EXISTS scheduled_jobs_dedupe_active_idx;
    END IF;
END $$;
CREATE UNIQUE INDEX IF NOT EXISTS scheduled_jobs_dedupe_active_idx
    ON scheduled_jobs (dedupe_key)
    WHERE dedupe_scope = 'active' AND status IN ('pending', 'running', 'waiting');

-- One row per step a workflow reached: kind step (a function's result),
-- transaction (writes committed with the checkpoint), sleep, signal (a wait
-- for one), spawn (a child job; its outcome lands here when it ends), wait
-- (for children). status: completed, failed (a step whose retries ran out),
-- waiting (a park not yet over; a spawn whose child has not ended).
CREATE TABLE IF NOT EXISTS workflow_steps (
    job_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL CHECK (
                    kind IN ('step', 'transaction', 'sleep', 'signal', 'spawn', 'wait')),
    name        TEXT NOT NULL,
    key         TEXT NOT NULL DEFAULT '',
    status      TEXT NOT NULL CHECK (status IN ('completed', 'failed', 'waiting')),
    result      JSONB,
    error       TEXT,
    attempts    INTEGER NOT NULL DEFAULT 1,
    started_at  TIMESTAMPTZ,
    finished_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq),
    UNIQUE (job_id, name, key)
);
-- A parent's children not yet ended (the wake-up check of each child's end).
CREATE INDEX IF NOT EXISTS workflow_steps_waiting_idx
    ON workflow_steps (job_id, seq) WHERE status = 'waiting';

-- Signals, oldest first; consumed_seq: the wait (step seq) that took it.
CREATE TABLE IF NOT EXISTS workflow_signals (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       TEXT NOT NULL,
    name         TEXT NOT NULL,
    payload      JSONB,
    sent_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    consumed_seq INTEGER
);
CREATE INDEX IF NOT EXISTS workflow_signals_job_idx ON workflow_signals (job_id, id);

-- Cancel the unfinished children of ``parent`` that were not spawned detached
-- (read from its spawn steps), as cancel_job() does: a running one hears it on
-- the cancel channel, its attempt is recorded; events are sent. Each child's
-- own end then writes its outcome on the parent's step (the trigger below).
CREATE OR REPLACE FUNCTION pg_scheduler_workflow_cancel_children(parent TEXT, reason TEXT)
RETURNS INTEGER
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    schema_suffix TEXT := CASE WHEN current_schema() = 'public' THEN ''
                               ELSE ':' || current_schema() END;
    n INTEGER;
    told_count INTEGER;
    sent_count INTEGER;
BEGIN
    WITH doomed AS (
        SELECT s.result ->> 'job_id' AS job_id FROM workflow_steps s
         WHERE s.job_id = parent AND s.status = 'waiting' AND s.kind = 'spawn'
           AND NOT coalesce((s.result ->> 'detached')::boolean, false)
    ), target AS (
        SELECT j.job_id, j.status, j.attempts, j.worker_id, j.started_at
          FROM scheduled_jobs j
         WHERE j.job_id IN (SELECT d.job_id FROM doomed d)
           AND j.status IN ('pending', 'running', 'waiting')
         ORDER BY j.job_id
           FOR UPDATE
    ), cancelled AS (
        UPDATE scheduled_jobs j
           SET status = 'cancelled', finished_at = now(), lease_until = NULL,
               error_message = reason
          FROM target t
         WHERE j.job_id = t.job_id AND j.status IN ('pending', 'running', 'waiting')
        RETURNING j.job_id, j.task_name, j.attempts, j.queue, t.status AS old_status,
                  t.worker_id, t.started_at
    ), kept AS (
        INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error)
        SELECT c.job_id, c.attempts, c.worker_id, c.started_at, 'cancelled', reason
          FROM cancelled c WHERE c.old_status = 'running'
    ), told AS (
        SELECT pg_notify('pg_scheduler_cancel' || schema_suffix, c.job_id)
          FROM cancelled c WHERE c.old_status = 'running'
    ), sent AS (
        SELECT pg_notify('pg_scheduler_events' || schema_suffix,
                         format('{"k":"cancelled","t":%s,"j":[%s]}',
                                extract(epoch FROM now()), string_agg(e.item, ',')))
          FROM (SELECT json_build_array(c.job_id, c.task_name, c.attempts, c.worker_id,
                                        NULL, c.queue)::text AS item,
                       (row_number() OVER (ORDER BY c.job_id) - 1) / 20 AS chunk
                  FROM cancelled c) e
         GROUP BY e.chunk
    )
    SELECT (SELECT count(*) FROM cancelled), (SELECT count(*) FROM told),
           (SELECT count(*) FROM sent)
      INTO n, told_count, sent_count;
    RETURN n;
END $$;

-- A job left pending/running/waiting for a final status (or was deleted
-- unfinished). As a parent: its unfinished children are cancelled. As a child:
-- its outcome is written on its parent's spawn step, and a parent waiting for
-- its children is woken once none of those it waits for is unfinished. The
-- parent's row is locked first: a parent parking holds that lock until its
-- choice (wait, or go on) is committed, and each statement here reads afresh,
-- so a wake-up is never lost between the two.
CREATE OR REPLACE FUNCTION pg_scheduler_workflow_job_done() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    child RECORD;
    parent RECORD;
    outcome JSONB;
BEGIN
    IF TG_OP = 'DELETE' THEN
        child := OLD;
        -- A running row deleted is a completion that deletes its row (vacuum
        -- trigger IMMEDIATE): its result was not kept.
        outcome := CASE WHEN OLD.status = 'running'
                        THEN jsonb_build_object('status', 'completed', 'result', NULL,
                                                'deleted', true)
                        ELSE jsonb_build_object('status', 'failed', 'error',
                                                'the job was deleted before it finished')
                   END;
    ELSE
        child := NEW;
        outcome := jsonb_build_object('status', NEW.status, 'result', NEW.result,
                                      'error', NEW.error_message);
    END IF;
    IF child.has_children THEN
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
    UPDATE workflow_steps s
       SET status = 'completed', finished_at = now(),
           result = s.result || jsonb_build_object('outcome', outcome)
     WHERE s.job_id = parent.job_id AND s.seq = child.parent_seq AND s.status = 'waiting'
       AND s.kind = 'spawn' AND s.result ->> 'job_id' = child.job_id;
    -- Pending too: a parent parked with its deadline near is pending, due then.
    IF parent.status IN ('waiting', 'pending') AND parent.wait_kind = 'children' AND NOT EXISTS (
        SELECT 1 FROM workflow_steps s
         WHERE s.job_id = parent.job_id AND s.status = 'waiting' AND s.kind = 'spawn'
           AND s.seq >= lower(parent.wait_children) AND s.seq < upper(parent.wait_children))
    THEN
        UPDATE scheduled_jobs
           SET status = 'pending', execution_time = now(), wait_kind = NULL, wait_for = NULL,
               wake_at = NULL, wait_seq = NULL, wait_children = NULL
         WHERE job_id = parent.job_id;
        PERFORM pg_notify(CASE WHEN current_schema() = 'public' THEN 'pg_scheduler_jobs'
                               ELSE 'pg_scheduler_jobs:' || current_schema() END,
                          CASE WHEN parent.queue = 'default' THEN '' ELSE parent.queue END);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS scheduled_jobs_workflow_done ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_workflow_done
    AFTER UPDATE OF status ON scheduled_jobs FOR EACH ROW
    WHEN ((NEW.parent_job_id IS NOT NULL OR NEW.has_children)
          AND NEW.status IN ('completed', 'failed', 'cancelled', 'expired')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled', 'expired'))
    EXECUTE FUNCTION pg_scheduler_workflow_job_done();
DROP TRIGGER IF EXISTS scheduled_jobs_workflow_deleted ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_workflow_deleted
    AFTER DELETE ON scheduled_jobs FOR EACH ROW
    WHEN ((OLD.parent_job_id IS NOT NULL OR OLD.has_children)
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled', 'expired'))
    EXECUTE FUNCTION pg_scheduler_workflow_job_done();

-- REPLACE of a job that ran (conflict_resolution=REPLACE, a dedupe key's
-- REPLACE: both write created_at = now()) makes a new job under the same id:
-- the old run's steps and signals go, its unfinished children are cancelled,
-- and what the row waited for is forgotten.
CREATE OR REPLACE FUNCTION pg_scheduler_workflow_replaced() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF OLD.has_children THEN
        PERFORM pg_scheduler_workflow_cancel_children(
            OLD.job_id, format('cancelled: its parent job %s was replaced', OLD.job_id));
    END IF;
    DELETE FROM workflow_steps WHERE job_id = OLD.job_id;
    DELETE FROM workflow_signals WHERE job_id = OLD.job_id;
    IF NEW.wait_kind IS NOT NULL OR NEW.has_children OR NEW.workflow_deadline IS NOT NULL THEN
        UPDATE scheduled_jobs
           SET wait_kind = NULL, wait_for = NULL, wake_at = NULL, wait_seq = NULL,
               wait_children = NULL, workflow_deadline = NULL, has_children = false
         WHERE job_id = NEW.job_id;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS scheduled_jobs_workflow_replaced ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_workflow_replaced
    AFTER UPDATE OF created_at ON scheduled_jobs FOR EACH ROW
    WHEN (OLD.created_at IS DISTINCT FROM NEW.created_at
          AND (OLD.started_at IS NOT NULL OR OLD.has_children))
    EXECUTE FUNCTION pg_scheduler_workflow_replaced();

-- Steps and signals go with their job (vacuum, delete-on-complete, by hand):
-- one check per statement while no workflow has ever run, one join otherwise.
CREATE OR REPLACE FUNCTION pg_scheduler_workflow_forget() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        -- DELETE, not TRUNCATE: a TRUNCATE of several tables may name these too.
        DELETE FROM workflow_steps;
        DELETE FROM workflow_signals;
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM workflow_steps LIMIT 1) THEN
        DELETE FROM workflow_steps s USING old_rows o WHERE s.job_id = o.job_id;
    END IF;
    IF EXISTS (SELECT 1 FROM workflow_signals LIMIT 1) THEN
        DELETE FROM workflow_signals s USING old_rows o WHERE s.job_id = o.job_id;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS scheduled_jobs_workflow_forget ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_workflow_forget
    AFTER DELETE ON scheduled_jobs REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_workflow_forget();
DROP TRIGGER IF EXISTS scheduled_jobs_workflow_truncate ON scheduled_jobs;
CREATE TRIGGER scheduled_jobs_workflow_truncate
    AFTER TRUNCATE ON scheduled_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_workflow_forget();
