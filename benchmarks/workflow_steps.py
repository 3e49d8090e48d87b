"""What a workflow step costs: a 10-step no-op workflow, in process.

``python benchmarks/workflow_steps.py [--dsn DSN] [--workflows 300] [--concurrency 20]``:
one embedded server (or ``--dsn``), one started Scheduler in this process.

- per step: each ``await ctx.step(...)`` of a no-op function timed inside
  the workflow (its record written: one lease-guarded INSERT), workflows run
  one at a time; p50 and p99;
- throughput: ``--workflows`` workflows scheduled at once, at most
  ``--concurrency`` running: workflows/s and steps/s from the first schedule
  to the last completion.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from datetime import UTC, datetime

import asyncpg
import structlog
from checkouts import server_dsn  # benchmarks/, next to this script
from driver import pct  # the latency scenarios' percentile

from pg_scheduler import Scheduler, WorkflowContext, workflow

structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    cache_logger_on_first_use=True,
)

STEPS = 10
step_ms: list[float] = []


def noop() -> None:
    return None


@workflow(name="bench.ten_steps")
async def ten_steps(ctx: WorkflowContext, timed: bool) -> int:
    for i in range(STEPS):
        t = time.perf_counter()
        await ctx.step("noop", noop, key=i)
        if timed:
            step_ms.append((time.perf_counter() - t) * 1000)
    return STEPS


async def main(dsn: str, workflows: int, concurrency: int) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=4, max_size=max(10, concurrency + 6))
    scheduler = Scheduler(
        pool, max_concurrent_jobs=concurrency, batch_claim_limit=concurrency, vacuum_enabled=False
    )
    await scheduler.start()
    await asyncio.sleep(2.0)  # past the start-up passes
    for _ in range(10):  # warm-up
        await scheduler.run(ten_steps, False)
    for _ in range(workflows // 3):
        await scheduler.run(ten_steps, True)
    print(
        f"per step ({len(step_ms)} steps, one workflow at a time): "
        f"p50 {statistics.median(step_ms):.3f} ms, p99 {pct(step_ms, 0.99):.3f} ms"
    )
    t = time.perf_counter()
    ids = [
        await scheduler.schedule(ten_steps, execution_time=datetime.now(UTC), args=(False,))
        for _ in range(workflows)
    ]
    for job_id in ids:
        await scheduler.wait_for(job_id, timeout=300)
    took = time.perf_counter() - t
    print(
        f"throughput ({workflows} workflows, {concurrency} at once): "
        f"{workflows / took:.0f} workflows/s, {workflows * STEPS / took:.0f} steps/s"
    )
    await scheduler.shutdown()
    await pool.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="PostgreSQL server (default: an embedded one)")
    parser.add_argument("--workflows", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(server_dsn(args.dsn, "workflow-steps-"), args.workflows, args.concurrency))
