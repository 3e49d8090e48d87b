-- The pg_scheduler schema as its migrations leave it (migrations/, 0001 to 0025),
-- in schema public: tables, indexes, triggers and functions as PostgreSQL 16
-- prints them from the catalog of a freshly migrated database.
--
-- Generated; do not edit. Change the schema with a new migration, then run
--     python -m pg_scheduler.store.dump_schema
-- tests/integration/test_schema_file.py fails when this file and the migrations disagree.

-- [table] job_attempts
CREATE TABLE public.job_attempts (
    attempt_id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    job_id text NOT NULL,
    attempt integer NOT NULL,
    worker_id text,
    started_at timestamp with time zone,
    finished_at timestamp with time zone DEFAULT now() NOT NULL,
    outcome text NOT NULL,
    error text,
    traceback text,
    CONSTRAINT job_attempts_pkey PRIMARY KEY (attempt_id),
    CONSTRAINT job_attempts_outcome_check CHECK ((outcome = ANY (ARRAY['failed'::text, 'timed_out'::text, 'cancelled'::text, 'rescued'::text, 'handed_back'::text])))
);

-- [index] job_attempts_job_idx on job_attempts
CREATE INDEX job_attempts_job_idx ON public.job_attempts USING btree (job_id, attempt_id);

-- [table] job_dependencies
CREATE TABLE public.job_dependencies (
    depends_on text NOT NULL,
    job_id text NOT NULL,
    ordinal integer DEFAULT 0 NOT NULL,
    on_failure text DEFAULT 'cancel'::text NOT NULL,
    met boolean DEFAULT false NOT NULL,
    status text,
    result jsonb,
    CONSTRAINT job_dependencies_pkey PRIMARY KEY (depends_on, job_id),
    CONSTRAINT job_dependencies_on_failure_check CHECK ((on_failure = ANY (ARRAY['cancel'::text, 'run'::text, 'wait'::text])))
)
WITH (
    fillfactor=50
);

-- [index] job_dependencies_job_idx on job_dependencies
CREATE INDEX job_dependencies_job_idx ON public.job_dependencies USING btree (job_id, ordinal);

-- [table] periodic_jobs
CREATE TABLE public.periodic_jobs (
    dedup_key text NOT NULL,
    job_name text NOT NULL,
    task_name text NOT NULL,
    schedule text NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    code_enabled boolean DEFAULT true NOT NULL,
    next_run timestamp with time zone,
    last_window timestamp with time zone,
    last_run timestamp with time zone,
    last_finished_at timestamp with time zone,
    last_job_id text,
    last_outcome text,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT periodic_jobs_pkey PRIMARY KEY (dedup_key),
    CONSTRAINT periodic_jobs_last_outcome_check CHECK ((last_outcome = ANY (ARRAY['running'::text, 'completed'::text, 'failed'::text, 'skipped'::text])))
);

-- [table] pg_scheduler_migrations
CREATE TABLE public.pg_scheduler_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT pg_scheduler_migrations_pkey PRIMARY KEY (version)
);

-- [table] scheduled_jobs
CREATE TABLE public.scheduled_jobs (
    job_id text DEFAULT (gen_random_uuid())::text NOT NULL,
    job_name text NOT NULL,
    execution_time timestamp with time zone NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    task_data jsonb DEFAULT '{"args": [], "kwargs": {}}'::jsonb,
    created_at timestamp with time zone DEFAULT CURRENT_TIMESTAMP,
    last_heartbeat timestamp with time zone,
    lease_until timestamp with time zone,
    priority integer DEFAULT 5 NOT NULL,
    retry_count integer DEFAULT 0 NOT NULL,
    max_retries integer DEFAULT 0 NOT NULL,
    worker_id text,
    error_message text,
    misfire_grace_time integer,
    task_name text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    rescue_count integer DEFAULT 0 NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    result jsonb,
    error_traceback text,
    timeout double precision,
    retry_policy jsonb,
    claimed_ahead boolean DEFAULT false NOT NULL,
    unstarted_rescues integer DEFAULT 0 NOT NULL,
    progress double precision,
    progress_message text,
    progress_at timestamp with time zone,
    queue text DEFAULT 'default'::text NOT NULL,
    dedupe_key text,
    dedupe_scope text,
    started_before boolean DEFAULT false NOT NULL,
    parent_job_id text,
    parent_seq integer,
    has_children boolean DEFAULT false NOT NULL,
    wait_kind text,
    wait_for text,
    wake_at timestamp with time zone,
    wait_seq integer,
    wait_children int4range,
    workflow_deadline timestamp with time zone,
    has_dependents boolean DEFAULT false NOT NULL,
    dependencies_unmet integer,
    concurrency_key text,
    max_running_per_key integer,
    rate_count_per_key integer,
    rate_period_per_key double precision,
    key_ordered boolean DEFAULT false NOT NULL,
    key_seq bigint,
    fair_share_key text,
    fair_share_weight double precision,
    CONSTRAINT scheduled_jobs_pkey PRIMARY KEY (job_id),
    CONSTRAINT scheduled_jobs_fair_share_weight_check CHECK (((fair_share_weight > (0)::double precision) AND (fair_share_weight < 'Infinity'::double precision))),
    CONSTRAINT scheduled_jobs_priority_check CHECK ((priority = ANY (ARRAY[1, 3, 5, 8]))),
    CONSTRAINT scheduled_jobs_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'waiting'::text, 'completed'::text, 'failed'::text, 'cancelled'::text, 'expired'::text]))),
    CONSTRAINT scheduled_jobs_wait_kind_check CHECK ((wait_kind = ANY (ARRAY['sleep'::text, 'signal'::text, 'children'::text, 'dependencies'::text])))
)
WITH (
    fillfactor=90,
    autovacuum_vacuum_scale_factor=0.01,
    autovacuum_vacuum_threshold=1000,
    autovacuum_vacuum_insert_scale_factor=0.01,
    autovacuum_analyze_scale_factor=0.01,
    autovacuum_vacuum_cost_delay=1
);

-- [index] scheduled_jobs_claim_idx on scheduled_jobs
CREATE INDEX scheduled_jobs_claim_idx ON public.scheduled_jobs USING btree (queue, task_name, priority, execution_time) WHERE ((status = 'pending'::text) AND (concurrency_key IS NULL) AND (fair_share_key IS NULL));

-- [index] scheduled_jobs_dashboard_idx on scheduled_jobs
CREATE INDEX scheduled_jobs_dashboard_idx ON public.scheduled_jobs USING btree (status, created_at, job_id) WHERE (status <> 'running'::text);

-- [index] scheduled_jobs_dedupe_active_idx on scheduled_jobs
CREATE UNIQUE INDEX scheduled_jobs_dedupe_active_idx ON public.scheduled_jobs USING btree (dedupe_key) WHERE ((dedupe_scope = 'active'::text) AND (status = ANY (ARRAY['pending'::text, 'running'::text, 'waiting'::text])));

-- [index] scheduled_jobs_dedupe_debounce_idx on scheduled_jobs
CREATE UNIQUE INDEX scheduled_jobs_dedupe_debounce_idx ON public.scheduled_jobs USING btree (dedupe_key) WHERE ((dedupe_scope = 'debounce'::text) AND (NOT started_before) AND ((status = 'pending'::text) OR ((status = 'running'::text) AND claimed_ahead)));

-- [index] scheduled_jobs_dedupe_pending_idx on scheduled_jobs
CREATE UNIQUE INDEX scheduled_jobs_dedupe_pending_idx ON public.scheduled_jobs USING btree (dedupe_key) WHERE ((dedupe_scope = 'pending'::text) AND (NOT started_before) AND ((status = 'pending'::text) OR ((status = 'running'::text) AND claimed_ahead)));

-- [index] scheduled_jobs_fair_idx on scheduled_jobs
CREATE INDEX scheduled_jobs_fair_idx ON public.scheduled_jobs USING btree (queue, task_name, fair_share_key, priority, execution_time) WHERE ((status = 'pending'::text) AND (fair_share_key IS NOT NULL));

-- [index] scheduled_jobs_finished_idx on scheduled_jobs
CREATE INDEX scheduled_jobs_finished_idx ON public.scheduled_jobs USING btree (status, finished_at) WHERE (finished_at IS NOT NULL);

-- [index] scheduled_jobs_key_due_idx on scheduled_jobs
CREATE INDEX scheduled_jobs_key_due_idx ON public.scheduled_jobs USING btree (execution_time) WHERE ((status = 'pending'::text) AND (concurrency_key IS NOT NULL));

-- [index] scheduled_jobs_key_order_idx on scheduled_jobs
CREATE INDEX scheduled_jobs_key_order_idx ON public.scheduled_jobs USING btree (concurrency_key, key_seq) WHERE (key_ordered AND (status = ANY (ARRAY['pending'::text, 'running'::text, 'waiting'::text])));

-- [index] scheduled_jobs_key_pending_idx on scheduled_jobs
CREATE INDEX scheduled_jobs_key_pending_idx ON public.scheduled_jobs USING btree (concurrency_key, priority, execution_time) WHERE ((status = 'pending'::text) AND (concurrency_key IS NOT NULL) AND (NOT key_ordered));

-- [index] scheduled_jobs_key_running_idx on scheduled_jobs
CREATE INDEX scheduled_jobs_key_running_idx ON public.scheduled_jobs USING btree (concurrency_key) WHERE ((status = 'running'::text) AND (concurrency_key IS NOT NULL));

-- [index] scheduled_jobs_periodic_pending_idx on scheduled_jobs
CREATE INDEX scheduled_jobs_periodic_pending_idx ON public.scheduled_jobs USING btree (task_name, execution_time) WHERE ((status = 'pending'::text) AND starts_with(task_name, 'periodic:'::text));

-- [index] scheduled_jobs_running_idx on scheduled_jobs
CREATE INDEX scheduled_jobs_running_idx ON public.scheduled_jobs USING btree (worker_id) WHERE (status = 'running'::text);

-- [index] scheduled_jobs_wake_idx on scheduled_jobs
CREATE INDEX scheduled_jobs_wake_idx ON public.scheduled_jobs USING btree (wake_at) WHERE (status = 'waiting'::text);

-- [trigger] scheduled_jobs_dependencies_forget on scheduled_jobs
CREATE TRIGGER scheduled_jobs_dependencies_forget AFTER DELETE ON public.scheduled_jobs REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_dependencies_forget();

-- [trigger] scheduled_jobs_dependencies_truncate on scheduled_jobs
CREATE TRIGGER scheduled_jobs_dependencies_truncate AFTER TRUNCATE ON public.scheduled_jobs FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_dependencies_forget();

-- [trigger] scheduled_jobs_dependency_deleted on scheduled_jobs
CREATE TRIGGER scheduled_jobs_dependency_deleted AFTER DELETE ON public.scheduled_jobs FOR EACH ROW WHEN ((old.has_dependents AND (old.status <> ALL (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text, 'expired'::text])))) EXECUTE FUNCTION pg_scheduler_dependency_done();

-- [trigger] scheduled_jobs_dependency_done on scheduled_jobs
CREATE TRIGGER scheduled_jobs_dependency_done AFTER UPDATE OF status ON public.scheduled_jobs FOR EACH ROW WHEN ((new.has_dependents AND (new.status = ANY (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text, 'expired'::text])) AND (old.status IS DISTINCT FROM new.status) AND (NOT ((old.status = 'running'::text) AND (new.status = 'completed'::text) AND (COALESCE(current_setting('pg_scheduler.dependencies_released'::text, true), ''::text) = 'on'::text))))) EXECUTE FUNCTION pg_scheduler_dependency_done();

-- [trigger] scheduled_jobs_events_delete on scheduled_jobs
CREATE TRIGGER scheduled_jobs_events_delete AFTER DELETE ON public.scheduled_jobs REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_job_events();

-- [trigger] scheduled_jobs_events_insert on scheduled_jobs
CREATE TRIGGER scheduled_jobs_events_insert AFTER INSERT ON public.scheduled_jobs REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_job_events();

-- [trigger] scheduled_jobs_key_seq on scheduled_jobs
CREATE TRIGGER scheduled_jobs_key_seq BEFORE INSERT OR UPDATE OF key_seq ON public.scheduled_jobs FOR EACH ROW WHEN ((new.key_ordered AND (new.key_seq IS NULL))) EXECUTE FUNCTION pg_scheduler_key_seq();

-- [trigger] scheduled_jobs_notify_insert on scheduled_jobs
CREATE TRIGGER scheduled_jobs_notify_insert AFTER INSERT ON public.scheduled_jobs REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_notify_jobs();

-- [trigger] scheduled_jobs_truncate_attempts on scheduled_jobs
CREATE TRIGGER scheduled_jobs_truncate_attempts AFTER TRUNCATE ON public.scheduled_jobs FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_truncate_attempts();

-- [trigger] scheduled_jobs_workflow_deleted on scheduled_jobs
CREATE TRIGGER scheduled_jobs_workflow_deleted AFTER DELETE ON public.scheduled_jobs FOR EACH ROW WHEN (((old.parent_job_id IS NOT NULL) OR (old.has_children AND (old.status <> ALL (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text, 'expired'::text]))))) EXECUTE FUNCTION pg_scheduler_workflow_job_done();

-- [trigger] scheduled_jobs_workflow_done on scheduled_jobs
CREATE TRIGGER scheduled_jobs_workflow_done AFTER UPDATE OF status ON public.scheduled_jobs FOR EACH ROW WHEN (((new.has_children OR ((new.parent_job_id IS NOT NULL) AND (NOT ((old.status = 'running'::text) AND (new.status = 'completed'::text) AND (COALESCE(current_setting('pg_scheduler.children_counted'::text, true), ''::text) = 'on'::text))))) AND (new.status = ANY (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text, 'expired'::text])) AND (old.status <> ALL (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text, 'expired'::text])))) EXECUTE FUNCTION pg_scheduler_workflow_job_done();

-- [trigger] scheduled_jobs_workflow_forget on scheduled_jobs
CREATE TRIGGER scheduled_jobs_workflow_forget AFTER DELETE ON public.scheduled_jobs REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_workflow_forget();

-- [trigger] scheduled_jobs_workflow_reopened on scheduled_jobs
CREATE TRIGGER scheduled_jobs_workflow_reopened AFTER UPDATE OF status ON public.scheduled_jobs FOR EACH ROW WHEN (((new.parent_job_id IS NOT NULL) AND (old.status = ANY (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text, 'expired'::text])) AND (new.status <> ALL (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text, 'expired'::text])))) EXECUTE FUNCTION pg_scheduler_workflow_job_done();

-- [trigger] scheduled_jobs_workflow_replaced on scheduled_jobs
CREATE TRIGGER scheduled_jobs_workflow_replaced AFTER UPDATE OF created_at ON public.scheduled_jobs FOR EACH ROW WHEN (((old.created_at IS DISTINCT FROM new.created_at) AND ((old.started_at IS NOT NULL) OR old.has_children))) EXECUTE FUNCTION pg_scheduler_workflow_replaced();

-- [trigger] scheduled_jobs_workflow_truncate on scheduled_jobs
CREATE TRIGGER scheduled_jobs_workflow_truncate AFTER TRUNCATE ON public.scheduled_jobs FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_workflow_forget();

-- [table] scheduler_batches
CREATE TABLE public.scheduler_batches (
    batch_id uuid NOT NULL,
    task_name text NOT NULL,
    queue text NOT NULL,
    worker_id text,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    batch_size integer NOT NULL,
    job_ids text[] NOT NULL,
    CONSTRAINT scheduler_batches_pkey PRIMARY KEY (batch_id)
);

-- [index] scheduler_batches_jobs_idx on scheduler_batches
CREATE INDEX scheduler_batches_jobs_idx ON public.scheduler_batches USING gin (job_ids) WITH (fastupdate='on');

-- [index] scheduler_batches_started_idx on scheduler_batches
CREATE INDEX scheduler_batches_started_idx ON public.scheduler_batches USING btree (started_at);

-- [table] scheduler_event_flags
CREATE TABLE public.scheduler_event_flags (
    kind text NOT NULL,
    until timestamp with time zone NOT NULL,
    CONSTRAINT scheduler_event_flags_pkey PRIMARY KEY (kind)
);

-- [table] scheduler_fair_share_starts
CREATE TABLE public.scheduler_fair_share_starts (
    fair_share_key text NOT NULL,
    worker_id text NOT NULL,
    cost double precision NOT NULL,
    starts double precision NOT NULL,
    at timestamp with time zone NOT NULL,
    CONSTRAINT scheduler_fair_share_starts_pkey PRIMARY KEY (fair_share_key, worker_id)
)
WITH (
    fillfactor=50
);

-- [table] scheduler_fair_share_weights
CREATE TABLE public.scheduler_fair_share_weights (
    fair_share_key text NOT NULL,
    weight double precision NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT scheduler_fair_share_weights_pkey PRIMARY KEY (fair_share_key),
    CONSTRAINT scheduler_fair_share_weights_weight_check CHECK (((weight > (0)::double precision) AND (weight < 'Infinity'::double precision)))
);

-- [table] scheduler_key_starts
CREATE TABLE public.scheduler_key_starts (
    concurrency_key text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    job_id text
);

-- [index] scheduler_key_starts_idx on scheduler_key_starts
CREATE INDEX scheduler_key_starts_idx ON public.scheduler_key_starts USING btree (concurrency_key, started_at);

-- [table] scheduler_limits
CREATE TABLE public.scheduler_limits (
    scope text NOT NULL,
    name text NOT NULL,
    max_running integer,
    rate_count integer,
    rate_period double precision,
    recent_starts timestamp with time zone[] DEFAULT '{}'::timestamp with time zone[] NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT scheduler_limits_pkey PRIMARY KEY (scope, name),
    CONSTRAINT scheduler_limits_max_running_check CHECK ((max_running > 0)),
    CONSTRAINT scheduler_limits_rate_count_check CHECK ((rate_count > 0)),
    CONSTRAINT scheduler_limits_rate_period_check CHECK ((rate_period > (0)::double precision)),
    CONSTRAINT scheduler_limits_scope_check CHECK ((scope = ANY (ARRAY['task'::text, 'queue'::text])))
);

-- [table] scheduler_queues
CREATE TABLE public.scheduler_queues (
    name text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT scheduler_queues_pkey PRIMARY KEY (name)
);

-- [table] scheduler_throttles
CREATE TABLE public.scheduler_throttles (
    throttle_key text NOT NULL,
    job_id text NOT NULL,
    until timestamp with time zone NOT NULL,
    CONSTRAINT scheduler_throttles_pkey PRIMARY KEY (throttle_key)
);

-- [table] scheduler_workers
CREATE TABLE public.scheduler_workers (
    worker_id text NOT NULL,
    hostname text NOT NULL,
    pid integer NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen timestamp with time zone DEFAULT now() NOT NULL,
    max_concurrent integer NOT NULL,
    tasks text[] DEFAULT '{}'::text[] NOT NULL,
    CONSTRAINT scheduler_workers_pkey PRIMARY KEY (worker_id)
)
WITH (
    fillfactor=50
);

-- [trigger] scheduler_workers_events_delete on scheduler_workers
CREATE TRIGGER scheduler_workers_events_delete AFTER DELETE ON public.scheduler_workers REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_worker_events();

-- [trigger] scheduler_workers_events_insert on scheduler_workers
CREATE TRIGGER scheduler_workers_events_insert AFTER INSERT ON public.scheduler_workers REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pg_scheduler_worker_events();

-- [table] vacuum_stats
CREATE TABLE public.vacuum_stats (
    stat_date date DEFAULT CURRENT_DATE NOT NULL,
    deleted_completed integer DEFAULT 0,
    deleted_failed integer DEFAULT 0,
    deleted_cancelled integer DEFAULT 0,
    last_run timestamp with time zone,
    worker_id text,
    deleted_expired integer DEFAULT 0,
    CONSTRAINT vacuum_stats_pkey PRIMARY KEY (stat_date)
);

-- [table] workflow_signals
CREATE TABLE public.workflow_signals (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    job_id text NOT NULL,
    name text NOT NULL,
    payload jsonb,
    sent_at timestamp with time zone DEFAULT now() NOT NULL,
    consumed_seq integer,
    idempotency_key text,
    CONSTRAINT workflow_signals_pkey PRIMARY KEY (id)
);

-- [index] workflow_signals_job_idx on workflow_signals
CREATE INDEX workflow_signals_job_idx ON public.workflow_signals USING btree (job_id, id);

-- [index] workflow_signals_key_idx on workflow_signals
CREATE UNIQUE INDEX workflow_signals_key_idx ON public.workflow_signals USING btree (job_id, idempotency_key) WHERE (idempotency_key IS NOT NULL);

-- [table] workflow_steps
CREATE TABLE public.workflow_steps (
    job_id text NOT NULL,
    seq integer NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    key text DEFAULT ''::text NOT NULL,
    status text NOT NULL,
    result jsonb,
    error text,
    attempts integer DEFAULT 1 NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT workflow_steps_pkey PRIMARY KEY (job_id, seq),
    CONSTRAINT workflow_steps_job_id_name_key_key UNIQUE (job_id, name, key),
    CONSTRAINT workflow_steps_kind_check CHECK ((kind = ANY (ARRAY['step'::text, 'transaction'::text, 'sleep'::text, 'signal'::text, 'spawn'::text, 'wait'::text]))),
    CONSTRAINT workflow_steps_status_check CHECK ((status = ANY (ARRAY['completed'::text, 'failed'::text, 'waiting'::text])))
);

-- [table] workflow_waits
CREATE TABLE public.workflow_waits (
    job_id text NOT NULL,
    wait_from integer,
    wait_to integer,
    wait_left integer,
    CONSTRAINT workflow_waits_pkey PRIMARY KEY (job_id)
)
WITH (
    fillfactor=30
);

-- [function] pg_scheduler_children_completed(parents text[], seqs integer[])
CREATE OR REPLACE FUNCTION public.pg_scheduler_children_completed(parents text[], seqs integer[])
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public'
AS $function$
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
END $function$;

-- [function] pg_scheduler_completing()
CREATE OR REPLACE FUNCTION public.pg_scheduler_completing()
 RETURNS boolean
 LANGUAGE sql
AS $function$
    SELECT set_config('pg_scheduler.dependencies_released', 'on', true) = 'on'
       AND set_config('pg_scheduler.children_counted', 'on', true) = 'on'
$function$;

-- [function] pg_scheduler_dependencies_completed(ids text[])
CREATE OR REPLACE FUNCTION public.pg_scheduler_dependencies_completed(ids text[])
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public'
AS $function$
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
END $function$;

-- [function] pg_scheduler_dependencies_forget()
CREATE OR REPLACE FUNCTION public.pg_scheduler_dependencies_forget()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public'
AS $function$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM job_dependencies;
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM job_dependencies LIMIT 1) THEN
        DELETE FROM job_dependencies e USING old_rows o WHERE e.job_id = o.job_id;
    END IF;
    RETURN NULL;
END $function$;

-- [function] pg_scheduler_dependencies_handed(ids text[], worker text, lease double precision, tasks text[], queues text[], room integer, start_now integer, below integer)
CREATE OR REPLACE FUNCTION public.pg_scheduler_dependencies_handed(ids text[], worker text, lease double precision, tasks text[], queues text[], room integer, start_now integer, below integer)
 RETURNS TABLE(job_id text, job_name text, task_name text, queue text, task_data text, priority integer, execution_time timestamp with time zone, status text, attempts integer, retry_count integer, max_retries integer, timeout double precision, retry_policy text, claimed_ahead boolean, has_dependents boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public'
AS $function$
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
END $function$;

-- [function] pg_scheduler_dependency_done()
CREATE OR REPLACE FUNCTION public.pg_scheduler_dependency_done()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public'
AS $function$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_scheduler_dependency_ended(
            OLD.job_id, CASE WHEN OLD.status = 'running' THEN 'completed' ELSE 'cancelled' END,
            NULL);
    ELSE
        PERFORM pg_scheduler_dependency_ended(NEW.job_id, NEW.status, NEW.result);
    END IF;
    RETURN NULL;
END $function$;

-- [function] pg_scheduler_dependency_ended(dep text, dep_status text, dep_result jsonb)
CREATE OR REPLACE FUNCTION public.pg_scheduler_dependency_ended(dep text, dep_status text, dep_result jsonb)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO 'public'
AS $function$
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
END $function$;

-- [function] pg_scheduler_job_events()
CREATE OR REPLACE FUNCTION public.pg_scheduler_job_events()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'public'
AS $function$
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
END $function$;

-- [function] pg_scheduler_key_seq()
CREATE OR REPLACE FUNCTION public.pg_scheduler_key_seq()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public'
AS $function$
BEGIN
    NEW.key_seq := nextval('scheduled_jobs_key_seq');
    RETURN NEW;
END $function$;

-- [function] pg_scheduler_notify_jobs()
CREATE OR REPLACE FUNCTION public.pg_scheduler_notify_jobs()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    chan TEXT := CASE WHEN TG_TABLE_SCHEMA = 'public' THEN 'pg_scheduler_jobs'
                      ELSE 'pg_scheduler_jobs:' || TG_TABLE_SCHEMA END;
BEGIN
    PERFORM pg_notify(chan, CASE WHEN q.queue = 'default' THEN '' ELSE q.queue END)
       FROM (SELECT DISTINCT n.queue FROM new_rows n
              WHERE coalesce(n.status, 'pending') = 'pending') q;
    RETURN NULL;
END $function$;

-- [function] pg_scheduler_truncate_attempts()
CREATE OR REPLACE FUNCTION public.pg_scheduler_truncate_attempts()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'public'
AS $function$
BEGIN
    -- DELETE, not TRUNCATE: "TRUNCATE scheduled_jobs, job_attempts" is in use here.
    DELETE FROM job_attempts;
    RETURN NULL;
END $function$;

-- [function] pg_scheduler_worker_events()
CREATE OR REPLACE FUNCTION public.pg_scheduler_worker_events()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
END $function$;

-- [function] pg_scheduler_workflow_cancel_children(parent text, reason text)
CREATE OR REPLACE FUNCTION public.pg_scheduler_workflow_cancel_children(parent text, reason text)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO 'public'
AS $function$
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
END $function$;

-- [function] pg_scheduler_workflow_children_ended(parent text, seqs integer[])
CREATE OR REPLACE FUNCTION public.pg_scheduler_workflow_children_ended(parent text, seqs integer[])
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public'
AS $function$
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
END $function$;

-- [function] pg_scheduler_workflow_forget()
CREATE OR REPLACE FUNCTION public.pg_scheduler_workflow_forget()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public'
AS $function$
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
END $function$;

-- [function] pg_scheduler_workflow_job_done()
CREATE OR REPLACE FUNCTION public.pg_scheduler_workflow_job_done()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public'
AS $function$
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
END $function$;

-- [function] pg_scheduler_workflow_replaced()
CREATE OR REPLACE FUNCTION public.pg_scheduler_workflow_replaced()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public'
AS $function$
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
END $function$;
