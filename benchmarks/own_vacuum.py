"""The workers' own VACUUM at a steady rate with finished rows retained, A/B.

``python benchmarks/own_vacuum.py --trees A_DIR,B_DIR [--retained 2000000]
[--rate 1000] [--seconds 90] [--rounds 2]``:
one embedded server (or ``--dsn``); each round runs each checkout's library in
turn (a subprocess whose working directory is the checkout), in a fresh
database that first receives ``--retained`` completed rows (what the default
retention, a day, keeps: 2,000,000 is about half an hour at 1,000 jobs/s).
Then one worker, ``Scheduler(max_concurrent_jobs=50, batch_claim_limit=50)``
with the default ``VacuumConfig``, runs no-op jobs that a producer in the same
process enqueues at ``--rate`` (a ``schedule_bulk`` every 50 ms) for
``--seconds``. Sampled every half second: the job table's dead rows
(``n_dead_tup``) and its heap and index sizes. Reported: the dead rows' peak (over the
run, and after its first 10 s) and their median after the first 10 s; the
worker's own VACUUMs (count, median and longest wall time, their sum); the claim latency (enqueue to
handler start) p50/p99, the sizes at the end, and how long autovacuum was
vacuuming the job table (a VACUUM of the worker's then skips it:
SKIP_LOCKED).
"""

from __future__ import annotations

import argparse
import sys

from checkouts import alternate, run_child, server_dsn  # benchmarks/, next to this script

CHILD = r"""
import asyncio, json, logging, statistics, sys, time
import structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                    cache_logger_on_first_use=True)
import asyncpg
from datetime import UTC, datetime
from pg_scheduler import JobSpec, Scheduler, task

DSN, RETAINED = sys.argv[1], int(sys.argv[2])
RATE, SECONDS = float(sys.argv[3]), float(sys.argv[4])
latencies = []
done = 0

@task(name="bench.own_vacuum")
async def job(enqueued: float) -> None:
    global done
    latencies.append(time.time() - enqueued)
    done += 1

def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None

async def main():
    pool = await asyncpg.create_pool(DSN, min_size=2, max_size=10)
    producer = Scheduler(pool)
    await producer.initialize_db()
    for off in range(0, RETAINED, 200_000):
        await pool.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
            " task_data, started_at, finished_at, attempts, worker_id)"
            " SELECT 'old' || i, 'bench.own_vacuum', 'bench.own_vacuum', now() - interval '1 hour',"
            " 'completed', jsonb_build_object('args', jsonb_build_array(0)), now(), now(), 1, 'w'"
            " FROM generate_series($1::int + 1, $1::int + least(200000, $2::int - $1::int)) i",
            off, RETAINED)
    await pool.execute("VACUUM ANALYZE scheduled_jobs")
    worker = Scheduler(pool, max_concurrent_jobs=50, batch_claim_limit=50)
    rounds = []
    service = worker.table_vacuum
    inner = service.store.vacuum
    async def timed(*a):
        t = time.perf_counter()
        try:
            return await inner(*a)
        finally:
            rounds.append(time.perf_counter() - t)
    service.store.vacuum = timed
    await worker.start()
    samples = []
    stop = asyncio.Event()
    async def sampler():
        conn = await asyncpg.connect(DSN)
        t0 = time.monotonic()
        while not stop.is_set():
            row = await conn.fetchrow(
                "SELECT n_dead_tup, pg_relation_size('scheduled_jobs') AS heap,"
                " pg_indexes_size('scheduled_jobs') AS idx,"
                " (SELECT count(*) FROM pg_stat_progress_vacuum p JOIN pg_stat_activity a"
                "   USING (pid) WHERE p.relid = 'scheduled_jobs'::regclass"
                "   AND a.backend_type = 'autovacuum worker') AS auto, autoanalyze_count"
                " FROM pg_stat_user_tables WHERE relid = 'scheduled_jobs'::regclass")
            samples.append((time.monotonic() - t0, row["n_dead_tup"], row["heap"], row["idx"],
                            row["auto"], row["autoanalyze_count"]))
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
        await conn.close()
    sampling = asyncio.create_task(sampler())
    per_tick = RATE * 0.05
    sent = 0.0; produced = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < SECONDS:
        sent += per_tick
        n = int(sent) - produced
        if n:
            now = datetime.now(UTC); stamp = time.time()
            await producer.schedule_bulk([JobSpec(func=job, execution_time=now, args=(stamp,))
                                          for _ in range(n)])
            produced += n
        await asyncio.sleep(max(0.0, t0 + (produced / RATE) - time.monotonic()))
    deadline = time.monotonic() + 120
    while done < produced and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    elapsed = time.monotonic() - t0
    stop.set(); await sampling
    await worker.shutdown()
    await pool.close()
    later = [s[1] for s in samples if s[0] >= 10]
    ms = lambda seconds: round(1000 * seconds, 1)
    result = {
        "jobs_per_s": round(done / elapsed), "left": produced - done,
        "dead_peak": max(s[1] for s in samples),
        "dead_peak_after_10s": max(later) if later else None,
        "dead_peak_at_s": round(max(samples, key=lambda s: s[1])[0], 1),
        "dead_median": statistics.median(later) if later else None,
        # Seconds during which autovacuum was vacuuming the job table (a
        # VACUUM of the worker's then skips it: SKIP_LOCKED).
        "autovacuum_s": sum(0.5 for s in samples if s[4]),
        # When an autoanalyze of the table was first counted: it sets the dead
        # rows to an estimate from its sample until the next VACUUM.
        "autoanalyzed_at_s": [
            round(b[0], 1) for a, b in zip(samples, samples[1:], strict=False) if b[5] > a[5]
        ],
        "vacuums": len(rounds),
        "vacuum_ms_median": ms(statistics.median(rounds)) if rounds else None,
        "vacuum_ms_max": ms(max(rounds)) if rounds else None,
        "vacuum_s_total": round(sum(rounds), 2),
        "claim_p50_ms": ms(pct(latencies, 0.5)), "claim_p99_ms": ms(pct(latencies, 0.99)),
        "heap_mb_end": round(samples[-1][2] / 2**20, 1),
        "indexes_mb_end": round(samples[-1][3] / 2**20, 1),
    }
    print("RESULT " + json.dumps(result))

asyncio.run(main())
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", required=True, help="comma-separated checkout directories")
    ap.add_argument("--retained", type=int, default=2_000_000)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dsn")
    args = ap.parse_args()
    dsn = server_dsn(args.dsn, "pgs-own-vacuum-")
    alternate(
        args.trees.split(","),
        args.rounds,
        lambda tree: run_child(
            dsn, tree, CHILD, [str(args.retained), str(args.rate), str(args.seconds)]
        )[0],
        (
            "dead_peak_after_10s",
            "dead_median",
            "vacuum_ms_median",
            "vacuum_s_total",
            "claim_p50_ms",
            "claim_p99_ms",
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
