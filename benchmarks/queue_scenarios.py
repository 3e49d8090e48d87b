"""Queue scenarios, this library only: a worker next to a due backlog
it cannot run.

``foreign``: ``cfg["foreign"]`` due jobs that the worker must not touch
(``kind`` "queue": in a queue it does not serve; "task": of a task it has not
registered, in its own queue; "none": no backlog, the baseline), then ``n`` due
jobs of its own; time the worker draining its ``n``.

``idle_cpu``: an idle worker next to ``foreign`` due jobs of another queue while
a producer inserts one more every 1/``rate`` s for ``seconds``: the CPU the
PostgreSQL server's processes used meanwhile, from /proc (percent of one core).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from server_cpu import cpu_seconds, server_pids  # benchmarks/, next to this script

FOREIGN_BASE = 20_000_000  # ids of the foreign backlog (never run)


async def foreign(c: Any, cfg: dict[str, Any], record: Any, wait_all_done: Any) -> dict[str, Any]:
    n, backlog, kind = cfg["n"], cfg["foreign"], cfg["kind"]
    record.reset(n)
    if kind != "none":
        for start in range(0, backlog, 50_000):
            ids = range(FOREIGN_BASE + start, FOREIGN_BASE + min(backlog, start + 50_000))
            await c.enqueue_foreign(ids, kind)
    await c.enqueue_due(range(n))
    await c.analyze()
    await cfg["settle"](cfg["dsn"])
    t0 = time.perf_counter()
    await c.start_worker(cfg["concurrency"], queues=["default"])
    finished = await wait_all_done(cfg["timeout"])
    elapsed = time.perf_counter() - t0
    await asyncio.sleep(0.5)  # a foreign job that runs shows up here
    await c.stop_worker()
    return {
        "jobs": n,
        "foreign": backlog if kind != "none" else 0,
        "kind": kind,
        "seconds": round(elapsed, 4),
        "jobs_per_s": round(record.done / elapsed, 1),
        "finished": finished,
        "check": record.verify(n),
    }


async def idle_cpu(c: Any, cfg: dict[str, Any], record: Any) -> dict[str, Any]:
    backlog, seconds, rate = cfg["foreign"], cfg["seconds"], cfg["rate"]
    record.reset(0)
    for start in range(0, backlog, 50_000):
        ids = range(FOREIGN_BASE + start, FOREIGN_BASE + min(backlog, start + 50_000))
        await c.enqueue_foreign(ids, "queue")
    await c.analyze()
    await cfg["settle"](cfg["dsn"])
    await c.start_worker(cfg["concurrency"], queues=["default"])
    await asyncio.sleep(2.0)  # start-up work (migrate check, rescue) is not idling
    pids = server_pids(await c.backend_pid())
    cpu0, t0 = cpu_seconds(pids), time.perf_counter()
    inserted = 0
    while time.perf_counter() - t0 < seconds:
        await c.enqueue_foreign_one(FOREIGN_BASE + backlog + inserted)
        inserted += 1
        await asyncio.sleep(max(0.0, t0 + inserted / rate - time.perf_counter()))
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds(pids + [p for p in server_pids(await c.backend_pid()) if p not in pids])
    await c.stop_worker()
    return {
        "foreign": backlog,
        "inserted": inserted,
        "seconds": round(elapsed, 2),
        # None: the server is not on this machine.
        "server_cpu_pct_of_core": round((cpu - cpu0) / elapsed * 100, 2) if pids else None,
        "foreign_ran": record.future_ran,
        "check": {"ok": record.done == 0},
    }
