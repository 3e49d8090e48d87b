"""Statements about a connection itself, not about any table."""

from __future__ import annotations

# The listener's health check: a round trip that touches nothing.
HEALTH_CHECK = "SELECT 1"
# The claim loop's held connection: a claim a crash forgets leaves its job
# pending, and the job's later synchronous completion flushes the claim first.
ASYNC_COMMIT = "SET synchronous_commit = off"
