"""What each index of ``scheduled_jobs`` costs a drain.

``python benchmarks/index_cost.py [--dsn DSN] [--n 50000] [--rounds 3]
[--contenders raw_limit_table,pg_scheduler] [--variants full,no_dashboard,...]``

The harness's drain scenario (same contenders, same checks: exactly once,
nothing lost), each run on a fresh database of one server, with some of the
migrations' indexes dropped after the schema is made and before the jobs are
enqueued. ``raw_limit`` (its own narrow table) runs in every round as the
reference, so the ratios come from one run. Rounds alternate the order.

Dropping an index here is a measurement, not a configuration: the library's
statements need them (claims and the heartbeat read them; the dashboard and the
vacuum page by them) — see pg_scheduler/store/schema.sql
for which serves what.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import uuid
from typing import Any

import driver  # benchmarks/, next to this script
from checkouts import admin, database_dsn, server_dsn

# The indexes a drain writes besides the primary key and the claim index.
VARIANTS: dict[str, tuple[str, ...]] = {
    "full": (),
    "no_dashboard": ("scheduled_jobs_dashboard_idx",),
    "no_dashboard_finished": ("scheduled_jobs_dashboard_idx", "scheduled_jobs_finished_idx"),
    "pkey_claim_running": (
        "scheduled_jobs_dashboard_idx",
        "scheduled_jobs_finished_idx",
        "scheduled_jobs_dedupe_active_idx",
        "scheduled_jobs_dedupe_pending_idx",
        "scheduled_jobs_periodic_pending_idx",
    ),
    "pkey_claim": (
        "scheduled_jobs_dashboard_idx",
        "scheduled_jobs_finished_idx",
        "scheduled_jobs_dedupe_active_idx",
        "scheduled_jobs_dedupe_pending_idx",
        "scheduled_jobs_periodic_pending_idx",
        "scheduled_jobs_running_idx",
    ),
}


async def _one(dsn: str, module: Any, drop: tuple[str, ...], n: int) -> dict[str, Any]:
    db = f"ix_{uuid.uuid4().hex[:8]}"
    await admin(dsn, f'CREATE DATABASE "{db}"')
    url = database_dsn(dsn, db)
    contender = module.Contender(url, driver.RECORD)
    try:
        await contender.setup()
        for index in drop:
            await admin(url, f"DROP INDEX {index}")
        if hasattr(contender, "prepare_worker"):
            await contender.prepare_worker(50)
        return await driver.drain(
            contender, {"n": n, "dsn": url, "concurrency": 50, "timeout": 600}
        )
    finally:
        await contender.close()
        await admin(dsn, f'DROP DATABASE "{db}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="PostgreSQL server (default: an embedded one)")
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contenders", default="raw_limit_table,pg_scheduler")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    dsn = server_dsn(args.dsn, "pgs-index-cost-")
    runs = [("raw_limit", "full")] + [
        (c, v) for c in args.contenders.split(",") for v in args.variants.split(",")
    ]
    modules = {name: driver.load_contender(name) for name, _ in runs}
    results: dict[tuple[str, str], list[dict[str, Any]]] = {run: [] for run in runs}
    for rnd in range(args.rounds):
        for name, variant in runs if rnd % 2 == 0 else list(reversed(runs)):
            out = asyncio.run(_one(dsn, modules[name], VARIANTS[variant], args.n))
            if not out["check"]["ok"] or not out["finished"]:
                raise SystemExit(f"{name} {variant}: check failed: {out['check']}")
            results[(name, variant)].append(out)
            print(
                rnd,
                name,
                variant,
                out["jobs_per_s"],
                out["python_cpu_us_per_job"],
                out["server_cpu_us_per_job"],
                flush=True,
            )
    raw = statistics.median(r["jobs_per_s"] for r in results[("raw_limit", "full")])
    print(f"\nmedians of {args.rounds}, {args.n:,} jobs; ratio to raw_limit in this run")
    print("contender        variant                  jobs/s  ratio  worker µs  server µs")
    for (name, variant), outs in results.items():
        rate = statistics.median(r["jobs_per_s"] for r in outs)
        worker = statistics.median(r["python_cpu_us_per_job"] for r in outs)
        server = [r["server_cpu_us_per_job"] for r in outs if r["server_cpu_us_per_job"]]
        print(
            f"{name:16} {variant:22} {rate:9,.0f}  {rate / raw:5.2f}  {worker:9.1f}"
            f"  {statistics.median(server) if server else float('nan'):9.1f}"
        )


if __name__ == "__main__":
    main()
