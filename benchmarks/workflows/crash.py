"""Crash scenario: five-step workflows on several worker processes, one of them
killed with SIGKILL every few seconds (and replaced), until every workflow is done.

    python benchmarks/workflows/crash.py                     # 1,000 workflows, 3 workers
    python benchmarks/workflows/crash.py --n 100 --json      # quicker
    python benchmarks/workflows/crash.py --dsn postgresql://...   # a fresh database of yours

Without ``--dsn`` it starts a private embedded PostgreSQL. The workflow is
``crash_flows.crash_wf``: four counted steps and one ``ctx.transaction()`` step.
Counted by the database, not by the library under test:

- every workflow completed, with the right result;
- no checkpointed step body ran again: a step's checkpoint is written before the
  next step begins, so a run of step k that starts after any run of a later step
  of the same workflow (its row's ``clock_timestamp()``) is a violation. A step
  may legitimately run twice when its worker died before its checkpoint
  committed: every such repeat must have a run on a killed worker;
- each transaction step's row exists exactly once.

Prints ``RESULT {...}`` (one JSON line) and exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import asyncpg  # noqa: E402
import structlog  # noqa: E402

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))

import crash_flows  # noqa: E402

from pg_scheduler import JobSpec, Scheduler  # noqa: E402

# Short leases, so a killed worker's workflows are rescued in seconds (the
# timings the project's own chaos run and fault tests use).
TIMINGS: dict[str, Any] = dict(
    heartbeat_interval=0.3,
    heartbeat_threshold=2.0,
    lease_duration=3.0,
    rescue_interval=0.5,
    listener_health_interval=0.5,
    vacuum_enabled=False,
    run_periodic_jobs=False,
)
FINAL = ("completed", "failed", "cancelled", "expired")


class Worker:
    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc = proc
        self.name = name

    @classmethod
    async def start(cls, dsn: str, options: dict[str, Any], log_dir: Path, name: str) -> Worker:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)])}
        with (log_dir / f"{name}.log").open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(HERE / "crash_worker.py"),
                dsn,
                json.dumps(options),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        worker = cls(proc, name)
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 90)
        if not line.startswith(b"READY"):
            raise RuntimeError(f"{name} did not start (see {log_dir / name}.log)")
        return worker

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        """Close its standard input (a graceful shutdown); kill it if it lingers."""
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.kill()
                await self.proc.wait()


async def run(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    log_dir = Path(tempfile.mkdtemp(prefix="wfbench-crash-"))
    workers: list[Worker] = []
    retired: list[Worker] = []
    killed: set[int] = set()
    count = 0
    options = {
        **TIMINGS,
        "max_concurrent_jobs": args.concurrency,
        "batch_claim_limit": args.concurrency,
        "step_sleep": args.step_sleep,
        "pool_size": 10,
    }

    async def start_worker() -> Worker:
        nonlocal count
        count += 1
        return await Worker.start(dsn, options, log_dir, f"worker-{count}")

    try:
        producer = Scheduler(pool, **TIMINGS)
        await producer.initialize_db()
        await pool.execute(crash_flows.DDL)
        due = await pool.fetchval("SELECT now()")
        specs = [
            JobSpec(
                func=crash_flows.crash_wf,
                execution_time=due,
                args=(f"w{i}", i),
                job_id=f"w{i}",
            )
            for i in range(args.n)
        ]
        await producer.schedule_bulk(specs)
        workers = list(await asyncio.gather(*(start_worker() for _ in range(args.workers))))
        began = time.monotonic()
        deadline = began + args.timeout
        done = asyncio.Event()

        async def killer() -> None:
            low, high = args.kill_every
            while not done.is_set():
                try:
                    await asyncio.wait_for(done.wait(), random.uniform(low, high))
                    return
                except TimeoutError:
                    pass
                at = random.randrange(len(workers))
                victim = workers[at]
                killed.add(victim.proc.pid)
                victim.kill()
                await victim.proc.wait()
                retired.append(victim)
                workers[at] = await start_worker()

        kills = asyncio.create_task(killer())
        finished = 0
        shown = time.monotonic()
        while time.monotonic() < deadline:
            finished = await pool.fetchval(
                "SELECT count(*) FROM scheduled_jobs WHERE job_id LIKE 'w%' AND status = ANY($1)",
                list(FINAL),
            )
            if finished >= args.n:
                break
            if time.monotonic() - shown > 5:
                shown = time.monotonic()
                print(f"[crash] {finished}/{args.n} done, {len(killed)} kills", file=sys.stderr)
            await asyncio.sleep(0.1)
        elapsed = time.monotonic() - began
        done.set()
        await kills
        print(f"[crash] {finished}/{args.n} done; checking", file=sys.stderr)
        return {**await checks(pool, args.n, killed), "elapsed_s": round(elapsed, 2)} | {
            "workflows": args.n,
            "workers": args.workers,
            "concurrency_per_worker": args.concurrency,
            "kills": len(killed),
            "timed_out": finished < args.n,
            "worker_logs": str(log_dir),
        }
    finally:
        for worker in workers + retired:
            await worker.stop()
        await pool.close()


async def checks(pool: asyncpg.Pool, n: int, killed: set[int]) -> dict[str, Any]:
    statuses = {
        r["status"]: r["n"]
        for r in await pool.fetch(
            "SELECT status, count(*) AS n FROM scheduled_jobs"
            " WHERE job_id LIKE 'w%' GROUP BY status"
        )
    }
    # result() of a Scheduler that never started opens its listener: shut it down.
    reader = Scheduler(pool)
    wrong: list[str] = []
    unread = 0
    try:
        for i in range(n):
            try:
                value = await reader.result(f"w{i}", timeout=5)
            except Exception:
                unread += 1
                continue
            if value != crash_flows.expected(i):
                wrong.append(f"w{i}={value!r}")
    finally:
        await reader.shutdown()
    runs = await pool.fetch(
        "SELECT key, step, count(*) AS n, array_agg(pid) AS pids"
        " FROM wf_step_runs GROUP BY key, step"
    )
    ran = {(r["key"], r["step"]) for r in runs}
    missing = [f"w{i}:{s}" for i in range(n) for s in (1, 2, 4, 5) if (f"w{i}", s) not in ran]
    repeated = [r for r in runs if r["n"] > 1]
    unexplained = [
        f"{r['key']}:{r['step']}" for r in repeated if not killed.intersection(r["pids"])
    ]
    # A run of a step that began after a later step of the same workflow had begun
    # (or after its transaction step's row was written): a checkpointed step ran again.
    after_checkpoint = await pool.fetch(
        f"""
        WITH ev AS (
            SELECT key, step, at FROM wf_step_runs
            UNION ALL SELECT key, {crash_flows.TX_STEP}, at FROM wf_tx_rows
        )
        SELECT a.key, a.step FROM ev a
         WHERE EXISTS (SELECT 1 FROM ev b WHERE b.key = a.key AND b.step > a.step AND b.at < a.at)
        """
    )
    tx = {
        r["key"]: r["n"]
        for r in await pool.fetch("SELECT key, count(*) AS n FROM wf_tx_rows GROUP BY key")
    }
    tx_missing = [f"w{i}" for i in range(n) if f"w{i}" not in tx]
    tx_twice = [k for k, c in tx.items() if c > 1]
    out = {
        "statuses": statuses,
        "completed": statuses.get("completed", 0),
        "results_wrong": wrong[:10],
        "results_unread": unread,
        "step_runs": sum(r["n"] for r in runs),
        "steps_missing": missing[:10],
        "steps_run_more_than_once": len(repeated),
        "repeats_without_a_killed_run": unexplained[:10],
        "checkpointed_step_ran_again": [f"{r['key']}:{r['step']}" for r in after_checkpoint][:10],
        "tx_rows_missing": tx_missing[:10],
        "tx_rows_twice": tx_twice[:10],
    }
    out["check"] = {
        "ok": out["completed"] == n
        and not wrong
        and not unread
        and not missing
        and not unexplained
        and not after_checkpoint
        and not tx_missing
        and not tx_twice
        and bool(killed),
        "kills_happened": bool(killed),
    }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="a fresh database (default: a private embedded server)")
    parser.add_argument("--n", type=int, default=1000, help="workflows")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=10, help="max_concurrent_jobs")
    parser.add_argument(
        "--step-sleep", type=float, default=0.1, help="each step body sleeps up to this (s)"
    )
    parser.add_argument(
        "--kill-every",
        type=float,
        nargs=2,
        default=(2.0, 4.0),
        metavar=("MIN", "MAX"),
        help="seconds between kill -9s",
    )
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true", help="print only the RESULT line")
    args = parser.parse_args()
    server = None
    dsn = args.dsn
    if not dsn:
        from pg_scheduler.embedded import EmbeddedPostgres

        server = EmbeddedPostgres(
            Path(tempfile.mkdtemp(prefix="wfbench-crash-pg-")) / "pgdata", cleanup="delete"
        )
        dsn = server.dsn
    result = asyncio.run(run(args, dsn))
    if not args.json:
        for key, value in result.items():
            print(f"  {key:32} {value}")
    print("RESULT " + json.dumps(result), flush=True)
    return 0 if result["check"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
