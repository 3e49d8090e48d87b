"""Reading what the per-key tests' job bodies recorded (``key_tasks``): each
key's spans, the most of them open at once, the most starts in a window."""

from __future__ import annotations

import asyncpg

from tests.support.common import wait_until


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one instant (an end before a start at the same time)."""
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, step in points:
        now += step
        most = max(most, now)
    return most


def most_starts_in(starts: list[float], window: float) -> int:
    """The most starts within any ``window`` seconds."""
    starts = sorted(starts)
    most = first = 0
    for last, t in enumerate(starts):
        while t - starts[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


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
