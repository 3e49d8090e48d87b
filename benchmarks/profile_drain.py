"""Where each microsecond of a drain goes: ``python benchmarks/profile_drain.py [--n 20000]``.

Drains N bulk-enqueued no-op jobs (``max_concurrent_jobs=50,
batch_claim_limit=50``, logging at WARNING) twice on one PostgreSQL (the
embedded one unless ``--dsn``), each in a fresh database:

1. unprofiled: wall time, the worker's CPU (``time.process_time``), the
   PostgreSQL backends' CPU (``/proc/<pid>/stat`` of the database's
   backends: the server must run on this machine), and the client-side time
   of each statement kind (claim, completion, heartbeat...: wall time from
   send to answer, which includes the server's work and the round trip);
2. under cProfile: the worker's Python time split by where it is spent,
   scaled to run 1's CPU per job (cProfile itself slows Python ~2x).

Then the server's plan and timing of one claim of 50 and one completion of
50 (EXPLAIN ANALYZE in a transaction rolled back). Per-job figures are
divided by N. CPU figures move less than wall time on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import os
import pstats
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog

structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    cache_logger_on_first_use=True,
)

import asyncpg  # noqa: E402
from checkouts import database_dsn  # noqa: E402  (benchmarks/, next to this script)

from pg_scheduler import JobSpec, Scheduler, task  # noqa: E402
from pg_scheduler.store import Store  # noqa: E402

N_DONE = 0
TARGET = 0
FINISHED: asyncio.Event | None = None


@task(name="profile.noop")
async def noop(i: int) -> None:
    global N_DONE
    N_DONE += 1
    if N_DONE >= TARGET and FINISHED is not None:
        FINISHED.set()


TICK = os.sysconf("SC_CLK_TCK")


def server_wide() -> float:
    """CPU of every postgres process on this machine (backends, WAL writer, checkpointer...)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    total += proc_cpu(int(entry.name))
            except OSError:
                pass
    return total


def proc_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


# -- statement timing (client side) ----------------------------------------------

STATEMENTS = ("claim", "complete", "heartbeat", "seconds_until_next_due", "emit_events")


class StatementTimer:
    """Wraps Store methods to time each call from send to answer."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._saved: dict[str, Callable[..., Any]] = {}

    def install(self) -> None:
        for name in STATEMENTS:
            original = getattr(Store, name)
            self._saved[name] = original

            def timed(*args: Any, _name: str = name, _f: Any = original, **kw: Any) -> Any:
                async def run() -> Any:
                    t = time.perf_counter()
                    try:
                        return await _f(*args, **kw)
                    finally:
                        self.seconds[_name] += time.perf_counter() - t
                        self.calls[_name] += 1

                return run()

            setattr(Store, name, timed)

    def uninstall(self) -> None:
        for name, original in self._saved.items():
            setattr(Store, name, original)


class RoomWait:
    """Times the claim loop's waits for room (``Slots.changed``): the held-row
    bound holding the next claim back until completions are written."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.waits = 0
        self._saved: Any = None

    def install(self) -> None:
        from pg_scheduler.engine import claimer

        self._saved = original = claimer.wait_on

        async def timed(event: asyncio.Event, timeout: float) -> None:
            t = time.perf_counter()
            try:
                await original(event, timeout)
            finally:
                if getattr(event, "_pgs_room", False):
                    self.seconds += time.perf_counter() - t
                    self.waits += 1

        claimer.wait_on = timed  # type: ignore[assignment]

    def uninstall(self) -> None:
        from pg_scheduler.engine import claimer

        if self._saved is not None:
            claimer.wait_on = self._saved


# -- one drain -------------------------------------------------------------------


async def drain(dsn: str, n: int, profile: bool) -> dict[str, Any]:
    global N_DONE, TARGET, FINISHED
    N_DONE, TARGET, FINISHED = 0, n, asyncio.Event()
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=10)
    try:
        producer = Scheduler(pool)
        await producer.initialize_db()
        when = datetime.now(UTC) - timedelta(seconds=1)
        specs = [JobSpec(func=noop, execution_time=when, args=(i,)) for i in range(n)]
        await producer.schedule_bulk(specs, batch_size=5000)
        await pool.execute("VACUUM ANALYZE")
        await pool.execute("CHECKPOINT")
        scheduler = Scheduler(pool, max_concurrent_jobs=50, batch_claim_limit=50)
        pids_sql = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        before = {r[0]: proc_cpu(r[0]) for r in await pool.fetch(pids_sql)}
        server0 = server_wide()
        timer = StatementTimer()
        room = RoomWait()
        scheduler.worker.slots.changed._pgs_room = True  # type: ignore[attr-defined]
        if not profile:
            timer.install()
            room.install()
        profiler = cProfile.Profile() if profile else None
        t0, cpu0 = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        await scheduler.start()
        await asyncio.wait_for(FINISHED.wait(), 900)
        if profiler is not None:
            profiler.disable()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        timer.uninstall()
        room.uninstall()
        rows = await pool.fetch(
            "SELECT pid, left(regexp_replace(query, '\\s+', ' ', 'g'), 60) AS q"
            " FROM pg_stat_activity WHERE datname = current_database()"
        )
        after = {r[0] for r in rows} | set(before)
        per_backend = sorted(
            (
                (
                    proc_cpu(pid) - before.get(pid, 0.0),
                    next((r[1] for r in rows if r[0] == pid), "?"),
                )
                for pid in after
            ),
            reverse=True,
        )
        backend = sum(c for c, _ in per_backend)
        server_cpu = server_wide() - server0
        await scheduler.shutdown()
        left = await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE status <> 'completed'"
        )
        return {
            "wall": wall,
            "cpu": cpu,
            "backend": backend,
            "per_backend": per_backend,
            "server": server_cpu,
            "left": left,
            "timer": timer,
            "room": room,
            "profiler": profiler,
        }
    finally:
        await pool.close()


# -- cProfile breakdown ----------------------------------------------------------

# (label, predicate on (file, function)) in order; the first match wins.
CATEGORIES: list[tuple[str, Callable[[str, str], bool]]] = [
    # cProfile times wall clock: the loop's epoll wait is idle time, left out.
    ("(idle: waiting in epoll)", lambda f, fn: "epoll" in fn),
    ("socket send/recv (syscalls)", lambda f, fn: "_socket.socket" in fn),
    ("the job's own function", lambda f, fn: "profile_drain" in f and fn == "noop"),
    ("claim: asyncpg + decoding rows", lambda f, fn: "asyncpg" in f and fn in ("fetch",)),
    ("engine: claim loop and dispatch", lambda f, fn: "engine/claimer" in f or "slots" in f),
    ("engine: executor (per-job run, context)", lambda f, fn: "engine/executor" in f),
    ("engine: completer (group commit)", lambda f, fn: "engine/completer" in f),
    ("store: building statements' arguments", lambda f, fn: "pg_scheduler/store" in f),
    ("other pg_scheduler code", lambda f, fn: "pg_scheduler" in f),
    ("asyncpg (protocol, records, pool)", lambda f, fn: "asyncpg" in f),
    ("asyncio (tasks, futures, loop)", lambda f, fn: "asyncio" in f or "selectors" in f),
    ("json / codecs", lambda f, fn: "json" in f or "codec" in fn),
]


def breakdown(profiler: cProfile.Profile) -> list[tuple[str, float]]:
    stats = pstats.Stats(profiler)
    totals: dict[str, float] = defaultdict(float)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (file, _line, fn), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        label = next((lab for lab, pred in CATEGORIES if pred(file, fn)), None)
        if label is None:
            label = "builtins and C calls" if file == "~" else "other Python"
        totals[label] += tottime
    return sorted(totals.items(), key=lambda kv: -kv[1])


def top_functions(profiler: cProfile.Profile, limit: int) -> str:
    import io

    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(limit)
    return out.getvalue()


# -- server plans ----------------------------------------------------------------


def _text(plan: list[Any]) -> str:
    return "\n".join(r[0] for r in plan)


async def explain(dsn: str, args_n: int) -> list[tuple[str, str]]:
    """EXPLAIN ANALYZE of a claim of 50 and a completion of those 50, rolled back."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        scheduler = Scheduler(pool)
        await scheduler.initialize_db()
        when = datetime.now(UTC) - timedelta(seconds=1)
        await scheduler.schedule_bulk(
            [JobSpec(func=noop, execution_time=when, args=(i,)) for i in range(args_n)]
        )
        await pool.execute("VACUUM ANALYZE")
        store = scheduler.store
        out: list[tuple[str, str]] = []
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            try:
                await conn.execute(f"PREPARE c AS {store._claim}")
                await conn.execute(f"PREPARE d AS {store._complete}")
                # Literal arguments: EXPLAIN EXECUTE takes no bind parameters.
                # The generic plan: what a prepared statement runs after its
                # first executions when the planner prefers it.
                await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                plan = await conn.fetch(
                    "EXPLAIN EXECUTE c(ARRAY['profile.noop'], 50, 'profiler', 300, 50, NULL, NULL)"
                )
                out.append(("claim, generic plan (EXPLAIN without ANALYZE)", _text(plan)))
                await conn.execute("SET LOCAL plan_cache_mode = auto")
                plan = await conn.fetch(
                    "EXPLAIN (ANALYZE, BUFFERS) EXECUTE c("
                    "ARRAY['profile.noop'], 50, 'profiler', 300, 50, NULL, NULL)"
                )
                out.append(("claim of 50 (EXPLAIN ANALYZE, rolled back)", _text(plan)))
                rows = await conn.fetch(
                    "SELECT job_id, attempts FROM scheduled_jobs WHERE worker_id = 'profiler'"
                )
                ids = ",".join(f"'{r['job_id']}'" for r in rows)
                by_id = ",".join(f'"{r["job_id"]}":[{r["attempts"]},null]' for r in rows)
                plan = await conn.fetch(
                    "EXPLAIN (ANALYZE, BUFFERS) EXECUTE d("
                    f"ARRAY[{ids}]::text[], '{{{by_id}}}', 'profiler')"
                )
                out.append(("completion of 50 (EXPLAIN ANALYZE, rolled back)", _text(plan)))
            finally:
                await tx.rollback()
        return out
    finally:
        await pool.close()


# -- main ------------------------------------------------------------------------


def per_job(seconds: float, n: int) -> str:
    return f"{seconds / n * 1e6:7.1f}"


async def amain(args: argparse.Namespace) -> int:
    if args.dsn:
        base = args.dsn
        server = None
    else:
        from pg_scheduler.embedded import EmbeddedPostgres

        server = EmbeddedPostgres(
            Path(tempfile.mkdtemp(prefix="pgs-prof-")) / "pgdata", cleanup="delete"
        )
        base = server.dsn

    async def fresh() -> tuple[str, str]:
        name = f"prof_{uuid.uuid4().hex[:8]}"
        conn = await asyncpg.connect(base)
        await conn.execute(f'CREATE DATABASE "{name}"')
        await conn.close()
        return name, database_dsn(base, name)

    n = args.n
    _, dsn1 = await fresh()
    plain = await drain(dsn1, n, profile=False)
    _, dsn2 = await fresh()
    prof = await drain(dsn2, n, profile=True)
    _, dsn3 = await fresh()
    plans = await explain(dsn3, n) if args.explain else []

    print(f"drain of {n:,} no-op jobs, one worker, max_concurrent_jobs=50, batch 50")
    print(
        f"  unprofiled: {n / plain['wall']:,.0f} jobs/s; left unfinished: {plain['left']}"
        f" (profiled run: {prof['left']})"
    )
    print("\nper job, microseconds (run 1, unprofiled):")
    print(f"  wall time                         {per_job(plain['wall'], n)}")
    print(f"  worker process CPU                {per_job(plain['cpu'], n)}")
    print(f"  PostgreSQL backends' CPU          {per_job(plain['backend'], n)}")
    for cpu, query in plain["per_backend"][:4]:
        print(f"    backend {per_job(cpu, n)}  last: {query}")
    print(f"  all postgres processes' CPU       {per_job(plain['server'], n)}")
    timer: StatementTimer = plain["timer"]
    print("\nstatements, client side (send to answer; overlaps the worker's Python work):")
    for name in STATEMENTS:
        calls = timer.calls.get(name, 0)
        if calls:
            secs = timer.seconds[name]
            print(
                f"  {name:26s} {calls:6d} calls, {secs / calls * 1e3:6.2f} ms each,"
                f" {per_job(secs, n)} us/job"
            )
    room: RoomWait = plain["room"]
    print(
        f"  claim loop waiting for room (held-row bound): {room.waits} waits,"
        f" {room.seconds * 1e3:.0f} ms in all, {per_job(room.seconds, n)} us/job"
        f" ({room.seconds / plain['wall']:.0%} of the drain)"
    )
    print("\nworker Python CPU by place (cProfile shares, scaled to run 1's CPU per job):")
    parts = [p for p in breakdown(prof["profiler"]) if not p[0].startswith("(idle")]
    total = sum(s for _, s in parts) or 1.0
    scale = plain["cpu"] / n * 1e6
    for label, secs in parts:
        print(f"  {label:42s} {secs / total * scale:6.1f} us  ({secs / total:5.1%})")
    if args.top:
        print("\n" + top_functions(prof["profiler"], args.top))
    for label, plan in plans:
        print(f"\n{label}:\n{plan}")
    if server is not None:
        server.stop()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/profile_drain.py")
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--dsn", help="PostgreSQL server DSN (default: embedded server)")
    parser.add_argument("--explain", action="store_true", help="also print the server's plans")
    parser.add_argument("--top", type=int, default=0, help="also print the top N functions")
    return asyncio.run(amain(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
