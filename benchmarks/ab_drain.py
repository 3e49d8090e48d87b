"""A/B drain of two checkouts on one PostgreSQL, alternated, with CPU per job.

``python benchmarks/ab_drain.py --trees A_DIR,B_DIR [--n 20000] [--rounds 3]
[--unconfigured-logging]``:
one embedded server (or ``--dsn``); each round drains N bulk-enqueued no-op
jobs with each checkout's library in turn (a subprocess whose working
directory is the checkout, so it imports that tree), in a fresh database.
Reports jobs/s, the worker's CPU per job (``time.process_time``) and the
PostgreSQL backends' CPU per job (``/proc/<pid>/stat`` of the database's
backends; the server must run on this machine). CPU per job moves less than
jobs/s when the machine is shared.
"""

from __future__ import annotations

import argparse
import sys

from checkouts import alternate, run_child, server_dsn  # benchmarks/, next to this script

# The application's logging: structlog at WARNING (LOG_CONFIG), or nothing at
# all (--unconfigured-logging: the library's defaults, as a script that sets
# nothing up gets them).
LOG_CONFIG = """
import structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                    cache_logger_on_first_use=True)
"""

CHILD = r"""
import asyncio, json, logging, os, sys, time
{log_config}
import asyncpg
from datetime import UTC, datetime, timedelta
from pg_scheduler import JobSpec, Scheduler, task

N = int(sys.argv[2]); DSN = sys.argv[1]
done = 0
finished = asyncio.Event()

@task(name="bench.job")
async def job(i: int) -> None:
    global done
    done += 1
    if done >= N:
        finished.set()

TICK = os.sysconf("SC_CLK_TCK")
def backend_cpu(pids):
    total = 0
    for pid in pids:
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except OSError:
            pass
    return total / TICK

async def main():
    pool = await asyncpg.create_pool(DSN, min_size=2, max_size=10)
    prod = Scheduler(pool)
    await prod.initialize_db()
    when = datetime.now(UTC) - timedelta(seconds=1)
    t = time.perf_counter()
    await prod.schedule_bulk([JobSpec(func=job, execution_time=when, args=(i,)) for i in range(N)],
                             batch_size=5000)
    enq = time.perf_counter() - t
    await pool.execute("VACUUM ANALYZE"); await pool.execute("CHECKPOINT")
    sched = Scheduler(pool, max_concurrent_jobs=50, batch_claim_limit=50)
    # Backends of this database (the pool grows during the drain: read them after too).
    q = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    pids0 = {r[0] for r in await pool.fetch(q)}
    c0 = {p: backend_cpu([p]) for p in pids0}
    t0 = time.perf_counter(); cpu0 = time.process_time()
    await sched.start()
    first = None
    await asyncio.wait_for(finished.wait(), 600)
    el = time.perf_counter() - t0; cpu = time.process_time() - cpu0
    pids1 = {r[0] for r in await pool.fetch(q)}
    pg = sum(backend_cpu([p]) - c0.get(p, 0) for p in pids1 | pids0)
    await sched.shutdown()
    left = await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE status <> 'completed'")
    await pool.close()
    print("RESULT " + json.dumps({"jobs_per_s": round(N / el), "py_us": round(cpu / N * 1e6, 1),
          "pg_us": round(pg / N * 1e6, 1), "enqueue_per_s": round(N / enq), "left": left}))

asyncio.run(main())
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", required=True, help="comma-separated checkout directories")
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dsn")
    ap.add_argument(
        "--unconfigured-logging",
        action="store_true",
        help="configure no logging in the drain's process (default: structlog at WARNING)",
    )
    args = ap.parse_args()
    child = CHILD.replace("{log_config}", "" if args.unconfigured_logging else LOG_CONFIG)
    dsn = server_dsn(args.dsn, "pgs-ab-")
    alternate(
        args.trees.split(","),
        args.rounds,
        lambda tree: run_child(dsn, tree, child, [str(args.n)])[0],
        ("jobs_per_s", "py_us", "pg_us"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
