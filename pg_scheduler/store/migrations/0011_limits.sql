-- 0011: global limits per task and per queue, enforced in the claim.
-- A row limits how many jobs of one task or queue run at once anywhere
-- (max_running) and how many start in any rolling window (rate_count starts
-- per rate_period seconds). recent_starts keeps one database timestamp per
-- start inside the current window (at most rate_count of them); the claim
-- that starts jobs of a limited task or queue holds this row's lock.
CREATE TABLE IF NOT EXISTS scheduler_limits (
    scope         TEXT NOT NULL CHECK (scope IN ('task', 'queue')),
    name          TEXT NOT NULL,
    max_running   INTEGER CHECK (max_running > 0),
    rate_count    INTEGER CHECK (rate_count > 0),
    rate_period   DOUBLE PRECISION CHECK (rate_period > 0),
    recent_starts TIMESTAMPTZ[] NOT NULL DEFAULT '{}',
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, name)
);
