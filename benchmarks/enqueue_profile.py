"""Bulk enqueue cost per row, A/B across checkouts, with client and server CPU.

``python benchmarks/enqueue_profile.py [--trees A_DIR,B_DIR] [--n 100000] [--rounds 5]``:
one embedded server (or ``--dsn``); each round bulk-enqueues N plain
``JobSpec`` (generated ids, one task, one time, ``args=(i,)``) with each
checkout's library in turn (a subprocess whose working directory is the
checkout, so it imports that tree), in a fresh database. Reports, per tree,
the medians of jobs/s, the client's CPU per row (``time.process_time``), the
database's backends' CPU per row and the CPU per row of all the server's processes
(``/proc/<pid>/stat``; the server must run on this machine). CPU per row
moves less than jobs/s on a shared machine. ``ENQUEUE_WARM=1``: a 200-row
bulk first, so the measured one pays no cold start (a fresh database's first
COPY costs the server about 0.8 us a row more at N=50,000).

``--profile``: instead, cProfile one ``schedule_bulk`` in the first tree and
print where its Python time goes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from checkouts import alternate, run_child, server_dsn  # benchmarks/, next to this script

CHILD = r"""
import asyncio, cProfile, json, logging, os, pstats, sys, time
from pathlib import Path
import structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                    cache_logger_on_first_use=True)
import asyncpg
from datetime import UTC, datetime, timedelta
from pg_scheduler import JobSpec, Scheduler, task

DSN, N, BATCH, PROFILE = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
TICK = os.sysconf("SC_CLK_TCK")

@task(name="bench.enqueue")
async def job(i: int) -> None:
    pass

def cpu_of(pid):
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    except OSError:
        return 0.0

def postgres_pids(postmaster):
    # This server's processes only: other servers may run on the machine.
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int(Path(entry, "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == postmaster:
                pids.append(int(entry.name))
    return pids

async def main():
    pool = await asyncpg.create_pool(DSN, min_size=2, max_size=10)
    sched = Scheduler(pool)
    await sched.initialize_db()
    when = datetime.now(UTC) + timedelta(hours=1)
    specs = [JobSpec(func=job, execution_time=when, args=(i,)) for i in range(N)]
    kw = {} if BATCH == "default" else {"batch_size": int(BATCH)}
    if os.environ.get("ENQUEUE_WARM"):  # one small COPY first: no cold-start costs below
        await sched.schedule_bulk([JobSpec(func=job, execution_time=when, args=(0,))] * 200)
    backend = await pool.fetchval("SELECT pg_backend_pid()")
    postmaster = int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
    q = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    pids0 = {r[0] for r in await pool.fetch(q)}
    b0 = {p: cpu_of(p) for p in pids0}
    all0 = {p: cpu_of(p) for p in postgres_pids(postmaster)}
    prof = cProfile.Profile() if PROFILE else None
    t0 = time.perf_counter(); c0 = time.process_time()
    if prof:
        prof.enable()
    await sched.schedule_bulk(specs, **kw)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t0; cpu = time.process_time() - c0
    pids1 = {r[0] for r in await pool.fetch(q)}
    backends = sum(cpu_of(p) - b0.get(p, 0.0) for p in pids0 | pids1)
    server = sum(cpu_of(p) - all0.get(p, 0.0) for p in postgres_pids(postmaster))
    count = await pool.fetchval("SELECT count(*) FROM scheduled_jobs") - (
        200 if os.environ.get("ENQUEUE_WARM") else 0
    )
    await pool.close()
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    print("RESULT " + json.dumps({
        "jobs_per_s": round(N / wall), "client_us": round(cpu / N * 1e6, 2),
        "backend_us": round(backends / N * 1e6, 2), "server_us": round(server / N * 1e6, 2),
        "rows": count}))

asyncio.run(main())
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", default=".", help="comma-separated checkout directories")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", default="default")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--dsn")
    args = ap.parse_args()
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    dsn = server_dsn(args.dsn, "pgs-enq-")

    def run(tree: str, profile: bool) -> tuple[dict, str]:
        child_args = [str(args.n), args.batch_size, "1" if profile else "0"]
        return run_child(dsn, tree, CHILD, child_args)

    if args.profile:
        result, stdout = run(trees[0], True)
        print(stdout)
        print(result)
        return 0
    alternate(
        trees,
        args.rounds,
        lambda tree: run(tree, False)[0],
        ("jobs_per_s", "client_us", "backend_us", "server_us"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
