"""Limited work beside an unlimited backlog: when limited jobs start, and what the drain keeps.

``python benchmarks/limited_priority.py --trees A_DIR,B_DIR [--scenarios burst,stream,held]
[--rounds 1] [--dsn DSN]``: one embedded server (or ``--dsn``); each round runs
each scenario with each checkout's library in turn (a child process whose
working directory and PYTHONPATH are the checkout, and whose two worker
processes import it too), in a fresh database.

- ``burst``: two worker processes (Scheduler defaults: 25 slots, claims of
  10) are idle; one ``schedule_bulk`` enqueues ``--burst-n`` (6,000)
  unlimited NORMAL no-op jobs and ``--burst-limited`` (30) CRITICAL jobs of a
  task with ``rate_limit=--rate`` (100/s). Reports when the limited jobs start
  (p50/p99/max seconds from the end of the enqueue call), how many unlimited
  jobs started before the first and before the last of them, and how long the
  unlimited jobs took to start.
- ``stream``: ``--stream-n`` (50,000) unlimited NORMAL no-op jobs are enqueued
  before two worker processes start; while they drain, CRITICAL jobs of a
  task with ``max_running=--stream-max-running`` (4) are enqueued one by one
  at ``--stream-rate`` (50/s) until the unlimited jobs are gone. Reports the
  limited jobs' start p50/p99/max from their enqueue and the drain rate
  (unlimited jobs per second between the first and the last one's start).
- ``held``: ``--held-n`` (5,000) CRITICAL jobs of a task with
  ``max_running=1`` (its limit full all along) and ``--stream-n`` unlimited
  NORMAL jobs, enqueued before two worker processes start: the drain rate
  of the unlimited jobs beside a limited backlog held at its limit.

Every job's body stamps its start (``time.time()``, one machine) in its
worker's memory; a worker writes its stamps to a file when it stops. Only a
smoke run makes sense on a shared machine: take figures on a quiet one.
"""

from __future__ import annotations

import argparse
import sys

from checkouts import alternate, run_child, server_dsn  # benchmarks/, next to this script

# The tasks, in the workers (which run them) and the producer (which names them).
TASKS = r"""
starts = {"plain": [], "limited": []}

@task(name="bench.plain")
async def plain(i: int) -> None:
    starts["plain"].append(time.time())

@task(name="bench.rated")
async def rated(i: int) -> None:
    starts["limited"].append((i, time.time()))

@task(name="bench.capped")
async def capped(i: int) -> None:
    starts["limited"].append((i, time.time()))
    await asyncio.sleep(0.002)
"""

# Logs go to stderr: stdout carries "ready" (a pipe nobody reads afterwards).
WORKER = r"""
import asyncio, json, logging, signal, sys, time
import structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                    logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                    cache_logger_on_first_use=True)
import asyncpg
from pg_scheduler import Scheduler, task

DSN, OUT = sys.argv[1], sys.argv[2]

{TASKS}
async def main():
    pool = await asyncpg.create_pool(DSN, min_size=2, max_size=10)
    sched = Scheduler(pool, vacuum_enabled=False, run_periodic_jobs=False)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await sched.start()
    print("ready", flush=True)
    await stop.wait()
    await sched.shutdown()
    await pool.close()
    with open(OUT, "w") as f:
        json.dump(starts, f)

asyncio.run(main())
""".replace("{TASKS}", TASKS)

CHILD = r"""
import asyncio, json, logging, os, subprocess, sys, tempfile, time
import structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                    cache_logger_on_first_use=True)
import asyncpg
from datetime import UTC, datetime, timedelta
from pg_scheduler import JobPriority, JobSpec, Scheduler, task
{TASKS}

DSN, SCENARIO, OPTS, WORKER = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
CRITICAL = JobPriority.CRITICAL

def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None

def start_workers(n):
    out = tempfile.mkdtemp(prefix="pgs-lp-out-")
    procs = []
    for k in range(n):
        path = os.path.join(out, f"w{k}.json")
        procs.append((subprocess.Popen([sys.executable, "-c", WORKER, DSN, path],
                                       stdout=subprocess.PIPE, text=True), path))
    return procs

def wait_ready(procs):
    for p, _ in procs:
        assert p.stdout.readline().strip() == "ready"

def stop_workers(procs):
    for p, _ in procs:
        p.terminate()
    starts = {"plain": [], "limited": []}
    for p, path in procs:
        p.wait(120)
        with open(path) as f:
            got = json.load(f)
        os.remove(path)
        starts["plain"] += got["plain"]
        starts["limited"] += got["limited"]
    os.rmdir(os.path.dirname(procs[0][1]))
    return starts

DEADLINE = time.monotonic() + 900  # a run that stalls fails instead of hanging

async def left(pool, task):
    if time.monotonic() > DEADLINE:
        raise TimeoutError("jobs left after 900 s")
    return await pool.fetchval(
        "SELECT count(*) FROM scheduled_jobs WHERE task_name = $1"
        " AND status IN ('pending', 'running')", task)

async def burst(pool, prod):
    n, k = OPTS["burst_n"], OPTS["burst_limited"]
    await prod.configure_task("bench.rated", rate_limit=OPTS["rate"])
    procs = start_workers(2)
    wait_ready(procs)
    now = datetime.now(UTC)
    specs = [JobSpec(rated, now, args=(i,), priority=CRITICAL) for i in range(k)]
    specs += [JobSpec(plain, now, args=(i,)) for i in range(n)]
    await prod.schedule_bulk(specs, batch_size=len(specs))
    enqueued = time.time()
    while await left(pool, "bench.plain") or await left(pool, "bench.rated"):
        await asyncio.sleep(0.2)
    s = stop_workers(procs)
    lim = sorted(t for _, t in s["limited"])
    plain_starts = sorted(s["plain"])
    delays = [t - enqueued for t in lim]
    return {
        "limited_started": len(lim),
        "limited_p50_s": round(pct(delays, 0.5), 3),
        "limited_p99_s": round(pct(delays, 0.99), 3),
        "limited_max_s": round(max(delays), 3),
        "unlimited_before_first": sum(t < lim[0] for t in plain_starts),
        "unlimited_before_last": sum(t < lim[-1] for t in plain_starts),
        "unlimited_n": len(plain_starts),
        "unlimited_last_start_s": round(plain_starts[-1] - enqueued, 3),
        "jobs_per_s": round(len(plain_starts) / (plain_starts[-1] - plain_starts[0])),
    }

async def stream(pool, prod):
    n = OPTS["stream_n"]
    await prod.configure_task("bench.capped", max_running=OPTS["stream_max_running"])
    when = datetime.now(UTC) - timedelta(seconds=1)
    await prod.schedule_bulk([JobSpec(plain, when, args=(i,)) for i in range(n)],
                             batch_size=5000)
    await pool.execute("VACUUM ANALYZE scheduled_jobs")
    procs = start_workers(2)
    wait_ready(procs)
    gap = 1.0 / OPTS["stream_rate"]
    enqueued = {}
    i = 0
    next_at = time.monotonic()
    checked = 0.0
    while True:
        enqueued[i] = time.time()
        await prod.schedule(capped, execution_time=datetime.now(UTC), args=(i,),
                            priority=CRITICAL)
        i += 1
        next_at += gap
        if time.monotonic() - checked > 0.25:
            checked = time.monotonic()
            if not await left(pool, "bench.plain"):
                break
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    while await left(pool, "bench.capped"):
        await asyncio.sleep(0.1)
    s = stop_workers(procs)
    delays = [t - enqueued[j] for j, t in s["limited"]]
    plain_starts = sorted(s["plain"])
    return {
        "limited_n": len(delays),
        "limited_p50_s": round(pct(delays, 0.5), 3),
        "limited_p99_s": round(pct(delays, 0.99), 3),
        "limited_max_s": round(max(delays), 3),
        "unlimited_n": len(plain_starts),
        "jobs_per_s": round(len(plain_starts) / (plain_starts[-1] - plain_starts[0])),
    }

async def held(pool, prod):
    n, k = OPTS["stream_n"], OPTS["held_n"]
    await prod.configure_task("bench.capped", max_running=1)
    when = datetime.now(UTC) - timedelta(seconds=1)
    specs = [JobSpec(capped, when, args=(i,), priority=CRITICAL) for i in range(k)]
    specs += [JobSpec(plain, when, args=(i,)) for i in range(n)]
    await prod.schedule_bulk(specs, batch_size=5000)
    await pool.execute("VACUUM ANALYZE scheduled_jobs")
    procs = start_workers(2)
    wait_ready(procs)
    while await left(pool, "bench.plain"):
        await asyncio.sleep(0.2)
    capped_left = await left(pool, "bench.capped")
    s = stop_workers(procs)
    plain_starts = sorted(s["plain"])
    return {
        "limited_started": len(s["limited"]),
        "limited_left": capped_left,
        "unlimited_n": len(plain_starts),
        "jobs_per_s": round(len(plain_starts) / (plain_starts[-1] - plain_starts[0])),
    }

async def main():
    pool = await asyncpg.create_pool(DSN, min_size=2, max_size=10)
    prod = Scheduler(pool, run_periodic_jobs=False)
    await prod.initialize_db()
    result = await {"burst": burst, "stream": stream, "held": held}[SCENARIO](pool, prod)
    await pool.close()
    print("RESULT " + json.dumps(result))

asyncio.run(main())
""".replace("{TASKS}", TASKS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", required=True, help="comma-separated checkout directories")
    ap.add_argument("--scenarios", default="burst,stream,held")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--dsn")
    ap.add_argument("--burst-n", type=int, default=6000)
    ap.add_argument("--burst-limited", type=int, default=30)
    ap.add_argument("--rate", default="100/s", help="the burst's limited task's rate_limit")
    ap.add_argument("--stream-n", type=int, default=50_000)
    ap.add_argument("--stream-rate", type=float, default=50.0, help="limited jobs per second")
    ap.add_argument("--stream-max-running", type=int, default=4)
    ap.add_argument("--held-n", type=int, default=5000, help="held: limited jobs (max_running=1)")
    args = ap.parse_args()
    opts = {
        "burst_n": args.burst_n,
        "burst_limited": args.burst_limited,
        "rate": args.rate,
        "stream_n": args.stream_n,
        "stream_rate": args.stream_rate,
        "stream_max_running": args.stream_max_running,
        "held_n": args.held_n,
    }
    import json

    dsn = server_dsn(args.dsn, "pgs-lp-")
    for scenario in args.scenarios.split(","):
        print("SCENARIO", scenario, flush=True)
        alternate(
            args.trees.split(","),
            args.rounds,
            lambda tree, s=scenario: run_child(dsn, tree, CHILD, [s, json.dumps(opts), WORKER])[0],
            ("jobs_per_s",)
            if scenario == "held"
            else ("limited_p50_s", "limited_p99_s", "jobs_per_s"),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
