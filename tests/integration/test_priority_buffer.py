"""A more urgent job claimed while every slot is busy overtakes the claimed-ahead rows."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from pg_scheduler import JobPriority, task
from tests.support.common import job_status, wait_until

STARTS: list[str] = []
GATES: dict[str, asyncio.Event] = {}


@task(name="test.gated")
async def gated(name: str) -> None:
    STARTS.append(name)
    await GATES.setdefault(name, asyncio.Event()).wait()


async def test_critical_job_overtakes_buffered_normal_jobs(pool, make_scheduler):
    STARTS.clear()
    GATES.clear()
    # Two slots and two claimed-ahead rows: N0, N1 run, N2, N3 wait in the buffer.
    scheduler = await make_scheduler(start=False, max_concurrent_jobs=2, batch_claim_limit=2)
    due = datetime.now(UTC) - timedelta(seconds=5)
    for i in range(6):
        await scheduler.schedule(
            gated, execution_time=due + timedelta(milliseconds=i), args=(f"N{i}",)
        )
    await scheduler.start()
    await wait_until(lambda: STARTS == ["N0", "N1"], message="N0 and N1 running")
    await wait_until(lambda: len(scheduler.worker.slots.buffer) == 2, message="two rows buffered")

    critical = await scheduler.schedule(
        gated, execution_time=datetime.now(UTC), args=("C",), priority=JobPriority.CRITICAL
    )
    # N0 ends: N2 starts from the buffer, and the room its completion leaves
    # is claimed by priority: the CRITICAL row, buffered while both slots are busy.
    GATES.setdefault("N0", asyncio.Event()).set()
    await wait_until(lambda: "N2" in STARTS, message="N2 started")
    await wait_until(
        lambda: any(r["job_id"] == critical for _, r in scheduler.worker.slots.buffer),
        message="the critical job claimed into the buffer",
    )
    assert await job_status(pool, critical) == "running"

    GATES.setdefault("N1", asyncio.Event()).set()
    await wait_until(lambda: len(STARTS) == 4, message="the next start")
    assert STARTS[3] == "C", STARTS  # not N3, claimed ahead before it

    for name in ("N2", "N3", "N4", "N5", "C"):
        GATES.setdefault(name, asyncio.Event()).set()
    await wait_until(lambda: len(STARTS) == 7, message="every job started")
