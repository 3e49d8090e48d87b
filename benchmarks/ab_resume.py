"""A/B of resumed workflows' drain, two checkouts on one PostgreSQL, alternated.

``python benchmarks/ab_resume.py --trees A_DIR,B_DIR [--n 10000] [--rounds 4]``:
one embedded server (or ``--dsn``); each round, with each checkout's library
in turn (a subprocess whose working directory is the checkout), in a fresh
database:

1. the plain drain: N bulk-enqueued no-op jobs, one
   ``Scheduler(max_concurrent_jobs=50, batch_claim_limit=50)``;
2. N workflows that each wait for a signal, run until every row is waiting,
   then the worker stopped;
3. every workflow signalled (``signal_bulk``, 1,000 a call) with no worker
   running, so that the drain below is the resumed runs' alone;
4. a new worker started at once (no VACUUM since the signals, as when
   runs resume as their signals come): the time until every workflow returned.

Reports both drains (jobs/s), their ratio, and the worker's CPU per resumed
workflow (``time.process_time``). The signals' own cost is left out on
purpose: ``python -m benchmarks.workflows`` times signalling and resuming
together.
"""

from __future__ import annotations

import argparse
import sys

from checkouts import alternate, run_child, server_dsn  # benchmarks/, next to this script

CHILD = r"""
import asyncio, json, logging, sys, time
import structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                    cache_logger_on_first_use=True)
import asyncpg
from datetime import UTC, datetime, timedelta
from pg_scheduler import JobSpec, Scheduler, task, workflow

N = int(sys.argv[2]); DSN = sys.argv[1]
done = 0
finished = asyncio.Event()

def one_more():
    global done
    done += 1
    if done >= N:
        finished.set()

@task(name="bench.plain")
async def plain(i: int) -> None:
    one_more()

@workflow(name="bench.parked")
async def parked(ctx, i: int):
    payload = await ctx.wait_for_signal("go", timeout=timedelta(hours=1))
    one_more()
    return payload

async def drain(pool):
    global done, finished
    done, finished = 0, asyncio.Event()
    sched = Scheduler(pool, max_concurrent_jobs=50, batch_claim_limit=50)
    t = time.perf_counter(); cpu = time.process_time()
    await sched.start()
    await asyncio.wait_for(finished.wait(), 600)
    elapsed, cpu = time.perf_counter() - t, time.process_time() - cpu
    await sched.shutdown()
    return elapsed, cpu

async def main():
    pool = await asyncpg.create_pool(DSN, min_size=2, max_size=10)
    prod = Scheduler(pool)
    await prod.initialize_db()
    when = datetime.now(UTC) - timedelta(seconds=1)
    await prod.schedule_bulk([JobSpec(func=plain, execution_time=when, args=(i,))
                              for i in range(N)], batch_size=5000)
    await pool.execute("VACUUM ANALYZE")
    plain_s, _ = await drain(pool)
    await prod.schedule_bulk([JobSpec(func=parked, execution_time=when, args=(i,), job_id=f"p{i}")
                              for i in range(N)], batch_size=5000)
    sched = Scheduler(pool, max_concurrent_jobs=50, batch_claim_limit=50)
    await sched.start()
    q = "SELECT count(*) FROM scheduled_jobs WHERE job_id LIKE 'p%' AND status <> 'waiting'"
    deadline = time.monotonic() + 600
    while await pool.fetchval(q):
        assert time.monotonic() < deadline, "the workflows did not all park"
        await asyncio.sleep(0.1)
    await sched.shutdown()
    items = [(f"p{i}", "go", i) for i in range(N)]
    for start in range(0, N, 1000):
        await prod.signal_bulk(items[start:start + 1000])
    resume_s, cpu = await drain(pool)
    left = await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE status <> 'completed'")
    await pool.close()
    print("RESULT " + json.dumps({"plain_per_s": round(N / plain_s),
          "resumed_per_s": round(N / resume_s), "ratio": round(plain_s / resume_s, 3),
          "py_us": round(cpu / N * 1e6, 1), "left": left}))

asyncio.run(main())
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", required=True, help="comma-separated checkout directories")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--dsn")
    args = ap.parse_args()
    dsn = server_dsn(args.dsn, "pgs-resume-")
    alternate(
        args.trees.split(","),
        args.rounds,
        lambda tree: run_child(dsn, tree, CHILD, [str(args.n)])[0],
        ("plain_per_s", "resumed_per_s", "ratio", "py_us"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
