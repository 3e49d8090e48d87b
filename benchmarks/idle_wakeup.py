"""What an idle machine adds to every round trip: the idle-latency targets' floor.

``python benchmarks/idle_wakeup.py [--dsn DSN] [--samples 200] [--gap-ms 20]``:
one embedded server (or ``--dsn``). Measures, back to back and with
``--gap-ms`` of idleness before each sample (as the latency scenarios wait
between jobs):

- a bare ``SELECT 1`` round trip on one held asyncpg connection, no library;
- ``schedule()`` of a due job to its first line, in a process whose started
  Scheduler(max_concurrent_jobs=50, batch_claim_limit=50) starts it (the
  in-process start: one INSERT and its commit), and how long ``schedule()``
  itself took.

On a virtual machine an idle process's CPU sleeps; waking the server's
backend (and the client) costs time the back-to-back samples do not pay, and
every sleeping process on a wake-up path (the producer's backend, the
LISTEN backend, the worker, its claim backend) pays it again. The difference between
the two columns is that cost: the machine's, not the library's.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import asyncpg
import structlog
from checkouts import probe_arguments, server_dsn  # benchmarks/, next to this script
from driver import pct  # the latency scenarios' percentile

from pg_scheduler import Scheduler, task

structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    cache_logger_on_first_use=True,
)

_started: dict[int, asyncio.Future[float]] = {}


@task(name="bench.idle_wakeup")
async def probe_job(i: int) -> None:
    waiter = _started.get(i)
    if waiter is not None and not waiter.done():
        waiter.set_result(time.perf_counter())


async def _spread(
    sample: Callable[[int], Awaitable[float]], samples: int, gap: float
) -> tuple[float, float]:
    """p50 and p99 (ms) of ``samples`` calls after 10 warm-up ones, ``gap`` s apart."""
    times: list[float] = []
    for i in range(samples + 10):
        if gap:
            await asyncio.sleep(gap)
        else:
            await asyncio.sleep(0)
        ms = await sample(i)
        if i >= 10:
            times.append(ms)
    return statistics.median(times), pct(times, 0.99)


async def main(dsn: str, samples: int, gap: float) -> None:
    conn = await asyncpg.connect(dsn)

    async def round_trip(_: int) -> float:
        t = time.perf_counter()
        await conn.fetchval("SELECT 1")
        return (time.perf_counter() - t) * 1000

    pool = await asyncpg.create_pool(dsn, min_size=4, max_size=10)
    scheduler = Scheduler(pool, max_concurrent_jobs=50, batch_claim_limit=50)
    await scheduler.start()
    await asyncio.sleep(3.0)  # past the start-up passes, as the latency scenarios wait
    loop = asyncio.get_running_loop()
    call_ms: list[float] = []

    async def schedule_to_start(i: int) -> float:
        _started[i] = loop.create_future()
        t = time.perf_counter()
        await scheduler.schedule(probe_job, execution_time=datetime.now(UTC), args=(i,))
        call_ms.append((time.perf_counter() - t) * 1000)
        try:
            started = await asyncio.wait_for(_started[i], 5.0)
        finally:
            del _started[i]
        return (started - t) * 1000

    print(f"{'':34} {'back to back':>20} {f'after {gap * 1000:.0f} ms idle':>20}")
    for name, sample in (
        ("SELECT 1 round trip", round_trip),
        ("schedule() -> job's first line", schedule_to_start),
    ):
        call_ms.clear()
        hot = await _spread(sample, samples, 0.0)
        hot_call = statistics.median(call_ms) if call_ms else None
        call_ms.clear()
        idle = await _spread(sample, samples, gap)
        idle_call = statistics.median(call_ms) if call_ms else None
        print(
            f"{name:34} {f'p50 {hot[0]:.2f} p99 {hot[1]:.2f} ms':>20} "
            f"{f'p50 {idle[0]:.2f} p99 {idle[1]:.2f} ms':>20}"
        )
        if hot_call is not None and idle_call is not None:
            returned = f"{f'{hot_call:.2f} ms':>20} {f'{idle_call:.2f} ms':>20}"
            print(f"{'  schedule() returned, p50':34} {returned}")
    await scheduler.shutdown()
    await pool.close()
    await conn.close()


if __name__ == "__main__":
    args = probe_arguments(__doc__)
    asyncio.run(main(server_dsn(args.dsn, "idle-wakeup-"), args.samples, args.gap_ms / 1000))
