"""This repository's pg_scheduler: ``@workflow`` functions with ``ctx.step``,
``ctx.wait_for_signal``, ``ctx.spawn`` / ``ctx.gather``, run by one
``Scheduler(max_concurrent_jobs=50, batch_claim_limit=50)`` in this process.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import structlog

# The application's logging setup, as in production: warnings and up.
# Before importing the library: its module loggers bind at import.
structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    cache_logger_on_first_use=True,
)

import pg_scheduler  # noqa: E402
from pg_scheduler import JobSpec, Scheduler, task  # noqa: E402

try:
    from pg_scheduler import WorkflowContext, workflow
except ImportError:  # a tree without workflows: only the plain drain runs
    WorkflowContext = Any  # type: ignore[misc,assignment]
    workflow = None

RECORD: Any = None
POOL_SIZE = 10  # as the queue harness's contender
SIGNAL_CHUNK = 1000


async def noop_step(i: int, k: int) -> int:
    RECORD.step(i, k)
    return i + k


@task(name="wfbench.plain")
async def plain_job(i: int) -> int:
    RECORD.enter(i)
    try:
        RECORD.finish(i, i)
        return i
    finally:
        RECORD.leave(i)


@task(name="wfbench.child")
async def child(i: int) -> int:
    RECORD.child(i)
    return i


if workflow is not None:

    @workflow(name="wfbench.steps")
    async def steps_wf(ctx: WorkflowContext, i: int, steps: int) -> int:
        RECORD.enter(i)
        try:
            total = 0
            for k in range(steps):
                total += await ctx.step(f"s{k}", noop_step, i, k)
            RECORD.finish(i, total)
            return total
        finally:
            RECORD.leave(i)

    @workflow(name="wfbench.parked")
    async def parked_wf(ctx: WorkflowContext, i: int) -> Any:
        RECORD.enter(i)
        try:
            RECORD.waiting(i)
            payload = await ctx.wait_for_signal("go", timeout=timedelta(hours=1))
            RECORD.finish(i, payload)
            return payload
        finally:
            RECORD.leave(i)

    @workflow(name="wfbench.parent")
    async def parent_wf(ctx: WorkflowContext, n: int) -> int:
        RECORD.parent_enter()
        results = await ctx.gather(*[ctx.spawn(child, i) for i in range(n)])
        RECORD.resumed()
        total = sum(results)
        RECORD.finish(0, total)
        return total


def _need_workflows() -> None:
    if workflow is None:
        raise RuntimeError("this tree's pg_scheduler has no workflows (no pg_scheduler.workflow)")


def _now() -> datetime:
    return datetime.now(UTC)


class Contender:
    version = f"pg_scheduler {getattr(pg_scheduler, '__version__', 'dev')} (this repo)"

    def __init__(self, dsn: str, record: Any, cfg: dict[str, Any]) -> None:
        global RECORD
        RECORD = record
        self.dsn = dsn
        self.pool: asyncpg.Pool | None = None  # the worker's
        self.client_pool: asyncpg.Pool | None = None  # bulk enqueue, counts
        self.producer: Scheduler | None = None
        self.scheduler: Scheduler | None = None
        self.one_by_one = bool(cfg.get("signal_one_by_one"))

    async def setup(self) -> None:
        self.pool = await asyncpg.create_pool(self.dsn, min_size=2, max_size=POOL_SIZE)
        self.client_pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=4)
        self.producer = Scheduler(self.client_pool)
        await self.producer.initialize_db()

    async def close(self) -> None:
        if self.scheduler is not None:
            await self.stop_worker()
        if self.producer is not None:
            await self.producer.shutdown()  # never started: stops what it may have opened
        for pool in (self.pool, self.client_pool):
            if pool is not None:
                await pool.close()

    def settings(self, cfg: dict[str, Any]) -> dict[str, Any]:
        c = cfg["concurrency"]
        return {
            "scheduler": f"Scheduler(pool, max_concurrent_jobs={c}, batch_claim_limit={c})",
            "worker_pool": f"asyncpg pool min 2, max {POOL_SIZE}",
            "signals": (
                "scheduler.signal() per workflow, 8 calls at a time"
                if self.one_by_one
                else f"scheduler.signal_bulk(), {SIGNAL_CHUNK} signals a call, one call at a time"
            ),
        }

    async def start_worker(self, concurrency: int, queue: bool = True) -> None:
        assert self.pool is not None
        self.scheduler = Scheduler(
            self.pool, max_concurrent_jobs=concurrency, batch_claim_limit=concurrency
        )
        await self.scheduler.start()

    async def stop_worker(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.shutdown()
            self.scheduler = None

    async def run_one(self, i: int, steps: int) -> int:
        _need_workflows()
        assert self.scheduler is not None
        job_id = await self.scheduler.schedule(steps_wf, execution_time=_now(), args=(i, steps))
        return await self.scheduler.result(job_id)

    async def _bulk(self, func: Any, ids: range, *extra: Any, prefix: str = "") -> None:
        assert self.producer is not None
        due = _now() - timedelta(seconds=1)
        specs = [
            JobSpec(
                func=func,
                execution_time=due,
                args=(i, *extra),
                **({"job_id": f"{prefix}{i}"} if prefix else {}),
            )
            for i in ids
        ]
        await self.producer.schedule_bulk(specs, batch_size=5000)

    async def enqueue_workflows(self, ids: range, steps: int) -> None:
        _need_workflows()
        await self._bulk(steps_wf, ids, steps)

    async def enqueue_plain(self, ids: range) -> None:
        await self._bulk(plain_job, ids)

    async def start_parked(self, ids: range) -> None:
        _need_workflows()
        await self._bulk(parked_wf, ids, prefix="p")

    async def wait_parked(self, n: int, timeout: float) -> bool:
        """Every workflow reached its wait: poll until none is left running."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while await self.running_rows() > 0:
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def signal_all(self, ids: range) -> None:
        """``signal_bulk`` in chunks of SIGNAL_CHUNK, one after another (the
        first woken workflows run while the next chunks are sent); with
        ``one_by_one``, ``signal()`` per workflow, 8 calls at a time."""
        assert self.scheduler is not None
        scheduler = self.scheduler
        if self.one_by_one:
            gate = asyncio.Semaphore(8)

            async def one(i: int) -> None:
                async with gate:
                    await scheduler.signal(f"p{i}", "go", i)

            await asyncio.gather(*(one(i) for i in ids))
            return
        items = [(f"p{i}", "go", i) for i in ids]
        for start in range(0, len(items), SIGNAL_CHUNK):
            await scheduler.signal_bulk(items[start : start + SIGNAL_CHUNK])

    async def start_fanout(self, n: int) -> str:
        _need_workflows()
        assert self.scheduler is not None
        return await self.scheduler.schedule(parent_wf, execution_time=_now(), args=(n,))

    async def fanout_result(self, job_id: str) -> Any:
        assert self.scheduler is not None
        return await self.scheduler.result(job_id)

    async def completed_count(self) -> int:
        assert self.client_pool is not None
        return await self.client_pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'"
        )

    async def running_rows(self) -> int:
        """Jobs holding a lease (a worker's slot)."""
        assert self.client_pool is not None
        return await self.client_pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE status = 'running'"
        )

    def pool_in_use(self) -> int | None:
        """Connections checked out of the worker's pool."""
        assert self.pool is not None
        return self.pool.get_size() - self.pool.get_idle_size()
