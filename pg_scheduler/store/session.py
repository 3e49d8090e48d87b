"""Statements about a connection itself, not about any table."""

from __future__ import annotations

# The listener's health check: a round trip that touches nothing.
HEALTH_CHECK = "SELECT 1"
# The claim loop's held connection: a claim a crash forgets leaves its job
# pending, and the job's later synchronous completion flushes the claim first.
ASYNC_COMMIT = "SET synchronous_commit = off"
# Its claims and next-due probes run with their generic plans: both are index
# nested loops whose shape does not depend on the parameters, and planning
# the claim each time (the "auto" mode keeps choosing custom plans for it)
# costs more than running it: measured 0.85 against 1.45 ms a claim.
GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"

# The server stops the scheduler's own statements a little before the client
# gives up on them: a slow statement then ends with an error on a connection
# that still works, and only a connection that does not answer at all is cut.
SERVER_SHARE_OF_BOUND = 0.8


def own_timeouts(statement_timeout: float) -> str:
    """The settings a session the scheduler holds takes for itself (only where a
    SET stays with the session: not behind pgbouncer in transaction mode):
    its own statement bound, and no lock_timeout (the bound covers lock waits),
    whatever the role or database sets."""
    milliseconds = max(1, int(statement_timeout * SERVER_SHARE_OF_BOUND * 1000))
    return f"SET statement_timeout = {milliseconds}; SET lock_timeout = 0"
