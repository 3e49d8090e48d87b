-- 0004: wake-ups are namespaced by schema. The trigger function lives in each
-- schema's migration; it notifies that schema's channel (public keeps the
-- 0.2.x name), so a NOTIFY in one schema never wakes another's workers.

CREATE OR REPLACE FUNCTION pg_scheduler_notify_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(CASE WHEN TG_TABLE_SCHEMA = 'public' THEN 'pg_scheduler_jobs'
                           ELSE 'pg_scheduler_jobs:' || TG_TABLE_SCHEMA END, '');
    RETURN NULL;
END $$;
