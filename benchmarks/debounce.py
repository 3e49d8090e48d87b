"""Debounce and throttle beside a plain enqueue, and the plain enqueue A/B
across checkouts.

``python benchmarks/debounce.py [--trees A_DIR,B_DIR] [--n 4000] [--keys 50] [--rounds 3]``
(from the repository root; ``--trees`` default: this tree only). One embedded
server (or ``--dsn``); each round runs each tree in turn (a subprocess whose
working directory is the checkout, so it imports that tree's library), in a
fresh database. Each run, from 8 concurrent callers on a pool of 8:

* plain: ``n`` ``schedule()`` calls, no keywords (jobs/s, and this
  process's CPU per call in microseconds, steadier than jobs/s on a shared
  machine): what every application pays, compared across trees;
* debounce: ``n`` calls spread over ``keys`` keys (``debounce=60``): calls/s,
  and as a ratio to the plain rate of the same run;
* merge: the same with a task's ``debounce_merge`` (a read, a lock, a
  merge and an update per call);
* throttle: ``n`` calls over ``keys`` keys (``throttle=60``).

The jobs are due in the future and no worker runs: only the enqueue is
measured. Medians over the rounds are printed last.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from checkouts import run_child, server_dsn  # benchmarks/, next to this script

CHILD = r"""
import asyncio, inspect, json, logging, sys, time
import structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                    cache_logger_on_first_use=True)
import asyncpg
from datetime import UTC, datetime, timedelta
from pg_scheduler import Scheduler, task
from pg_scheduler.store.migrate import migrate

DSN, N, KEYS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
CALLERS = 8

@task(name="bench.plain")
async def plain(i: int) -> None: ...

def merge(previous, new):
    return ((), {"ids": (previous.kwargs["ids"] + new.kwargs["ids"])[-20:]})

timed = "debounce" in inspect.signature(Scheduler.schedule).parameters
if timed:
    @task(name="bench.merged", debounce_merge=merge)
    async def merged(ids: list) -> None: ...

async def rate(call):
    async def caller(c):
        for i in range(c, N, CALLERS):
            await call(i)
    start = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(CALLERS)))
    return N / (time.perf_counter() - start)

async def main():
    conn = await asyncpg.connect(DSN)
    await migrate(conn)
    await conn.close()
    pool = await asyncpg.create_pool(DSN, min_size=CALLERS, max_size=CALLERS)
    s = Scheduler(pool)  # never started: it only enqueues
    later = datetime.now(UTC) + timedelta(hours=1)
    for i in range(200):  # warm: statements prepared, the table's first pages
        await s.schedule(plain, execution_time=later, args=(i,))
    cpu = time.process_time()
    out = {"jobs_per_s": await rate(lambda i: s.schedule(plain, execution_time=later, args=(i,)))}
    out["client_cpu_us"] = (time.process_time() - cpu) / N * 1e6
    if timed:
        out["debounce_per_s"] = await rate(
            lambda i: s.schedule(plain, args=(i,), dedupe_key=f"d{i % KEYS}", debounce=60))
        out["merge_per_s"] = await rate(
            lambda i: s.schedule(merged, kwargs={"ids": [i]}, dedupe_key=f"m{i % KEYS}",
                                 debounce=60))
        out["throttle_per_s"] = await rate(
            lambda i: s.schedule(plain, args=(i,), dedupe_key=f"t{i % KEYS}", throttle=60))
        for name in ("debounce", "merge", "throttle"):
            out[name + "_ratio"] = out[name + "_per_s"] / out["jobs_per_s"]
    await pool.close()
    print("RESULT " + json.dumps(out))

asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dsn", help="PostgreSQL server (default: an embedded one)")
    args = parser.parse_args()
    dsn = server_dsn(args.dsn, "pgs-debounce-")
    trees = args.trees.split(",")
    results: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    for rnd in range(args.rounds):
        for tree in trees if rnd % 2 == 0 else list(reversed(trees)):
            result, _ = run_child(dsn, tree, CHILD, [str(args.n), str(args.keys)])
            results[tree].append(result)
            print(rnd, tree, result, flush=True)
    for tree, runs in results.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            continue
        med = {k: round(statistics.median(r[k] for r in ok), 3) for k in ok[0]}
        print("MEDIAN", tree, med)
    if len(trees) == 2 and all(results.values()):
        a, b = (statistics.median(r["jobs_per_s"] for r in results[t]) for t in trees)
        print(f"plain schedule() jobs/s: {trees[1]} / {trees[0]} = {b / a:.3f}")
        a, b = (statistics.median(r["client_cpu_us"] for r in results[t]) for t in trees)
        print(f"plain schedule() client CPU per call: {trees[1]} / {trees[0]} = {b / a:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
