-- 0018: weighted fair share between keys (tenants).
--
-- A job may carry a fair_share_key (a tenant id, usually) and a
-- fair_share_weight (NULL: 1). Keyed pending rows live in an index of their
-- own, led by the queue and task as the claim index is, then the key: the
-- fair claim (store/fair_sql.py) finds each (queue, task, key, priority)
-- group with one descent and reads each group's head, so a key's backlog
-- costs a claim one descent whatever its size. The plain claim index leaves
-- these rows out, as it leaves out rows with a concurrency key (0017): a
-- plain claim never walks them. (A job carries one of the two keys at most.)
ALTER TABLE scheduled_jobs
    ADD COLUMN IF NOT EXISTS fair_share_key TEXT,
    ADD COLUMN IF NOT EXISTS fair_share_weight DOUBLE PRECISION
        CONSTRAINT scheduled_jobs_fair_share_weight_check
        CHECK (fair_share_weight > 0 AND fair_share_weight < 'infinity');

DROP INDEX IF EXISTS scheduled_jobs_claim_idx;
CREATE INDEX scheduled_jobs_claim_idx
    ON scheduled_jobs (queue, task_name, priority, execution_time)
    WHERE status = 'pending' AND concurrency_key IS NULL AND fair_share_key IS NULL;

CREATE INDEX IF NOT EXISTS scheduled_jobs_fair_idx
    ON scheduled_jobs (queue, task_name, fair_share_key, priority, execution_time)
    WHERE status = 'pending' AND fair_share_key IS NOT NULL;

-- Each worker's recent starts per key, decaying: ``cost`` is the sum of
-- 1/weight of the starts, ``starts`` their number, both as of ``at`` and
-- decaying by exp(-age / time constant) from then (the fair claim writes its
-- own worker's rows in the statement that starts the jobs, so no two claims
-- ever wait on one row). The key '' stands for the jobs without a key.
CREATE TABLE IF NOT EXISTS scheduler_fair_share_starts (
    fair_share_key TEXT NOT NULL,
    worker_id      TEXT NOT NULL,
    cost           DOUBLE PRECISION NOT NULL,
    starts         DOUBLE PRECISION NOT NULL,
    at             TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (fair_share_key, worker_id)
) WITH (fillfactor = 50);

-- Weights set per key at run time (Scheduler.set_fair_share_weight): they
-- win over the weight a job carries.
CREATE TABLE IF NOT EXISTS scheduler_fair_share_weights (
    fair_share_key TEXT PRIMARY KEY,
    weight         DOUBLE PRECISION NOT NULL
        CHECK (weight > 0 AND weight < 'infinity'),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
GRANT SELECT ON scheduler_fair_share_weights TO PUBLIC;
