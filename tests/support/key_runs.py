"""Reading what the per-key tests' job bodies recorded (``key_tasks``): each
key's spans (``tests.support.spans`` measures them), and waiting for the jobs."""

from __future__ import annotations

import asyncpg

from tests.support.common import wait_until


async def finished(pool: asyncpg.Pool, count: int, timeout: float = 30) -> None:
    """Wait until ``count`` jobs have a final status."""

    async def done() -> bool:
        return (
            await pool.fetchval(
                "SELECT count(*) FROM scheduled_jobs"
                " WHERE status IN ('completed', 'failed', 'cancelled')"
            )
            >= count
        )

    await wait_until(done, timeout=timeout, interval=0.05, message=f"{count} jobs finished")


async def spans(pool: asyncpg.Pool, key: str) -> list[tuple[float, float]]:
    """(start, end) of every recorded run of ``key``."""
    rows = await pool.fetch("SELECT started, ended FROM key_runs WHERE key = $1", key)
    return [(r["started"], r["ended"]) for r in rows]


async def spans_by_key(pool: asyncpg.Pool) -> dict[str, list[tuple[float, float]]]:
    """(start, end) of every recorded run, by key."""
    by_key: dict[str, list[tuple[float, float]]] = {}
    for r in await pool.fetch("SELECT key, started, ended FROM key_runs"):
        by_key.setdefault(r["key"], []).append((r["started"], r["ended"]))
    return by_key
