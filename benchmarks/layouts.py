"""Candidate physical layouts of the job table, as raw SQL, under sustained load.

Each layout is the least SQL a durable queue with 0.2.x's columns runs per job
in that layout: a bulk insert, a claim of up to 50 due rows with ``FOR UPDATE
SKIP LOCKED`` and one completion statement per batch, with no library around
it (the same spirit as the ``raw_limit`` contender of the drain harness). The
worker runs in this process: a claim loop on one connection, 1 ms of work per
job, completions written on a second connection, concurrency 50.

Layouts:

* ``current``: one wide table; the claim index is partial on
  ``status = 'pending'``; the claim and the completion update the row in
  place. Other partial indexes on status for the running rows, the
  retention sweep and the dashboard, as pg_scheduler has them.
* ``cursor``: the same table and indexes; the claim starts its index scan at
  the oldest due time it claimed last, less a second, instead of at the start
  of the index, and reads the whole index at most once a second (so a row
  that became pending behind the bound waits at most that long).
* ``moved``: finished rows move, in the completion statement, into a child
  table that inherits from the job table, so that ``SELECT ... FROM jobs``
  still sees every job; the parent holds only pending and running rows.
* ``hot``: a narrow ready table (job id, queue, priority, due time) is the
  claim's only index on status-like data; the wide table has no index on a
  column the claim or the completion change, and a fillfactor of 70, so both
  updates of the wide row are HOT.

Phases (each ``--phase-seconds``): ``clean`` at ``--rate`` jobs/s, then
``pinned`` at the same rate while another connection holds a
``REPEATABLE READ`` transaction open (the xmin horizon cannot advance, so no
dead row can be removed), then a drain of ``--drain-n`` bulk-inserted jobs.
Sampled every second: claim latency (insert to the claim returning the row,
from the row's own ``created_at``), the dead and live tuples and the size of
every relation of the layout. The drain reports jobs/s and PostgreSQL server
CPU per job (local server only).

    python -m benchmarks.layouts [--layouts current,cursor,moved,hot]
        [--rate 1000] [--phase-seconds 60] [--drain-n 50000] [--vacuum-every S]
        [--dsn DSN] [--json FILE]

``--vacuum-cost-rows N`` instead times that VACUUM for ``current`` and
``moved`` with N finished rows kept, after each of three rounds of 2,000
jobs.

``--vacuum-options "PARALLEL 0"`` adds those options to that ``VACUUM``
(both modes): without ``PARALLEL 0``, PostgreSQL may start parallel workers
for the cleanup of each index larger than ``min_parallel_index_scan_size``,
whose start-up alone costs tens of milliseconds.

``--vacuum-every S`` runs the layout's own ``VACUUM`` (of the tables the claim
and the completion churn) every S seconds during the two phases, as a library
could, instead of leaving it to autovacuum (which visits a database at most
once per ``autovacuum_naptime``, a minute by default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from benchmarks.server_cpu import cpu_seconds, server_pids

_WIDE_COLUMNS = """
    job_id         TEXT PRIMARY KEY,
    task_name      TEXT NOT NULL,
    task_data      BYTEA,
    queue          TEXT NOT NULL DEFAULT 'default',
    priority       INT NOT NULL DEFAULT 5,
    execution_time TIMESTAMPTZ NOT NULL DEFAULT now(),
    status         TEXT NOT NULL DEFAULT 'pending',
    created_at     TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    started_at     TIMESTAMPTZ,
    finished_at    TIMESTAMPTZ,
    worker_id      TEXT,
    retry_count    INT NOT NULL DEFAULT 0,
    max_retries    INT NOT NULL DEFAULT 0,
    lease_until    TIMESTAMPTZ,
    error_message  TEXT
"""

_CURRENT_INDEXES = [
    "CREATE INDEX jobs_claim ON jobs (queue, priority, execution_time) WHERE status = 'pending'",
    "CREATE INDEX jobs_running ON jobs (worker_id) WHERE status = 'running'",
    "CREATE INDEX jobs_finished ON jobs (status, finished_at) WHERE finished_at IS NOT NULL",
    "CREATE INDEX jobs_dashboard ON jobs (status, created_at, job_id) WHERE status <> 'running'",
]

_CLAIM_WIDE = """
UPDATE {only}jobs j SET status = 'running', started_at = clock_timestamp(), worker_id = 'w',
       lease_until = now() + interval '30 seconds'
  FROM (SELECT job_id FROM {only}jobs
         WHERE status = 'pending' AND queue = 'default' AND execution_time <= now(){bound}
         ORDER BY priority, execution_time LIMIT $1 FOR UPDATE SKIP LOCKED) t
 WHERE j.job_id = t.job_id
RETURNING j.job_id, extract(epoch FROM clock_timestamp() - j.created_at)::float8,
          j.execution_time
"""

_COMPLETE_IN_PLACE = """
UPDATE jobs SET status = 'completed', finished_at = clock_timestamp(), lease_until = NULL
 WHERE job_id = ANY($1::text[])
"""

_COLUMN_LIST = (
    "job_id, task_name, task_data, queue, priority, execution_time, status, created_at, "
    "started_at, finished_at, worker_id, retry_count, max_retries, lease_until, error_message"
)

_COMPLETE_MOVED = f"""
WITH d AS (DELETE FROM ONLY jobs WHERE job_id = ANY($1::text[]) RETURNING *)
INSERT INTO jobs_done ({_COLUMN_LIST})
SELECT job_id, task_name, task_data, queue, priority, execution_time, 'completed', created_at,
       started_at, clock_timestamp(), worker_id, retry_count, max_retries, NULL, error_message
  FROM d
"""

_CLAIM_HOT = """
WITH t AS (
    DELETE FROM ready r
     WHERE r.ctid = ANY(ARRAY(
           SELECT ctid FROM ready
            WHERE queue = 'default' AND execution_time <= now()
            ORDER BY priority, execution_time LIMIT $1 FOR UPDATE SKIP LOCKED))
    RETURNING r.job_id)
UPDATE jobs j SET status = 'running', started_at = clock_timestamp(), worker_id = 'w',
       lease_until = now() + interval '30 seconds'
  FROM t WHERE j.job_id = t.job_id
RETURNING j.job_id, extract(epoch FROM clock_timestamp() - j.created_at)::float8,
          j.execution_time
"""


@dataclass
class Layout:
    name: str
    ddl: list[str]
    relations: list[str]
    complete: str
    claim: str = _CLAIM_WIDE.format(only="", bound="")
    bounded_claim: str | None = None
    ready_table: bool = False
    # What a library-run VACUUM every --vacuum-every seconds covers (on
    # PostgreSQL before 18, VACUUM of an inheritance parent leaves its children).
    vacuum: tuple[str, ...] = ("VACUUM jobs",)


LAYOUTS: dict[str, Layout] = {
    "current": Layout(
        "current",
        [f"CREATE TABLE jobs ({_WIDE_COLUMNS})", *_CURRENT_INDEXES],
        ["jobs"],
        _COMPLETE_IN_PLACE,
    ),
    "cursor": Layout(
        "cursor",
        [f"CREATE TABLE jobs ({_WIDE_COLUMNS})", *_CURRENT_INDEXES],
        ["jobs"],
        _COMPLETE_IN_PLACE,
        bounded_claim=_CLAIM_WIDE.format(only="", bound=" AND execution_time >= $2"),
    ),
    "moved": Layout(
        "moved",
        [
            f"CREATE TABLE jobs ({_WIDE_COLUMNS})",
            "CREATE INDEX jobs_claim ON jobs (queue, priority, execution_time)"
            " WHERE status = 'pending'",
            "CREATE INDEX jobs_running ON jobs (worker_id) WHERE status = 'running'",
            "CREATE TABLE jobs_done () INHERITS (jobs)",
            "ALTER TABLE jobs_done ADD PRIMARY KEY (job_id)",
            "CREATE INDEX jobs_done_finished ON jobs_done (status, finished_at)",
            "CREATE INDEX jobs_done_dashboard ON jobs_done (status, created_at, job_id)",
        ],
        ["jobs", "jobs_done"],
        _COMPLETE_MOVED,
        claim=_CLAIM_WIDE.format(only="ONLY ", bound=""),
    ),
    "hot": Layout(
        "hot",
        [
            f"CREATE TABLE jobs ({_WIDE_COLUMNS}) WITH (fillfactor = 70)",
            "CREATE INDEX jobs_created ON jobs (created_at)",
            "CREATE TABLE ready (job_id TEXT NOT NULL, queue TEXT NOT NULL, priority INT NOT NULL,"
            " execution_time TIMESTAMPTZ NOT NULL)",
            "CREATE INDEX ready_claim ON ready (queue, priority, execution_time)",
        ],
        ["jobs", "ready"],
        _COMPLETE_IN_PLACE,
        claim=_CLAIM_HOT,
        ready_table=True,
        vacuum=("VACUUM ready", "VACUUM jobs"),
    ),
}

_PAYLOAD = os.urandom(256)
_BATCH = 50
_CONCURRENCY = 50
_FULL_SCAN_EVERY_S = 1.0  # the bounded claim's fallback to the whole index
_MARGIN_S = 1.0


@dataclass
class Run:
    layout: Layout
    dsn: str
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (when, seconds)
    completed: int = 0
    produced: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    cursor: datetime | None = None
    full_scan_at: float = 0.0
    target: int | None = None  # completions that set ``reached``
    reached: asyncio.Event = field(default_factory=asyncio.Event)

    async def insert(self, conn: asyncpg.Connection, start: int, n: int) -> None:
        ids = [f"j{i}" for i in range(start, start + n)]
        await conn.execute(
            "INSERT INTO jobs (job_id, task_name, task_data)"
            " SELECT i, 'noop', $2 FROM unnest($1::text[]) i",
            ids,
            _PAYLOAD,
        )
        if self.layout.ready_table:
            await conn.execute(
                "INSERT INTO ready (job_id, queue, priority, execution_time)"
                " SELECT i, 'default', 5, now() FROM unnest($1::text[]) i",
                ids,
            )

    async def produce(self, rate: float, seconds: float) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            tick = 0.01
            per_tick = rate * tick
            owed = 0.0
            start = time.monotonic()
            next_at = start
            while time.monotonic() - start < seconds:
                owed += per_tick
                n = int(owed)
                owed -= n
                if n:
                    async with conn.transaction():
                        await self.insert(conn, self.produced, n)
                    self.produced += n
                next_at += tick
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            await conn.close()

    async def claim(self, conn: asyncpg.Connection, room: int) -> list[asyncpg.Record]:
        bounded = self.layout.bounded_claim
        now = time.monotonic()
        if bounded is not None and self.cursor is not None and now < self.full_scan_at:
            return await conn.fetch(bounded, room, self.cursor)
        self.full_scan_at = now + _FULL_SCAN_EVERY_S
        return await conn.fetch(self.layout.claim, room)

    async def work(self) -> None:
        claim_conn = await asyncpg.connect(self.dsn)
        done_conn = await asyncpg.connect(self.dsn)
        running = 0
        finished: list[str] = []
        flushed = asyncio.Event()

        async def job(job_id: str) -> None:
            nonlocal running
            await asyncio.sleep(0.001)
            finished.append(job_id)
            running -= 1
            flushed.set()

        async def completer() -> None:
            while not (self.stop.is_set() and running == 0 and not finished):
                if not finished:
                    flushed.clear()
                    try:
                        await asyncio.wait_for(flushed.wait(), 0.05)
                    except TimeoutError:
                        pass
                    continue
                batch = finished[:]
                finished.clear()
                await done_conn.execute(self.layout.complete, batch)
                self.completed += len(batch)
                if self.target is not None and self.completed >= self.target:
                    self.reached.set()

        done_task = asyncio.create_task(completer())
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not self.stop.is_set():
                room = min(_BATCH, _CONCURRENCY - running)
                if room <= 0:
                    await asyncio.sleep(0.0005)
                    continue
                rows = await self.claim(claim_conn, room)
                if not rows:
                    await asyncio.sleep(0.001)
                    continue
                now = time.monotonic()
                oldest = min(r[2] for r in rows)
                self.cursor = oldest - timedelta(seconds=_MARGIN_S)
                for r in rows:
                    self.latencies.append((now, r[1]))
                    running += 1
                    t = asyncio.create_task(job(r[0]))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
            await done_task
        finally:
            done_task.cancel()
            await claim_conn.close()
            await done_conn.close()


async def _sample(conn: asyncpg.Connection, relations: list[str]) -> dict[str, Any]:
    rows = await conn.fetch(
        "SELECT relname, n_dead_tup, n_live_tup, pg_total_relation_size(relid) AS bytes,"
        " autovacuum_count FROM pg_stat_user_tables WHERE relname = ANY($1::text[])",
        relations,
    )
    out: dict[str, Any] = {
        "dead": sum(r["n_dead_tup"] for r in rows),
        "live": sum(r["n_live_tup"] for r in rows),
        "bytes": sum(r["bytes"] for r in rows),
        "autovacuums": sum(r["autovacuum_count"] for r in rows),
    }
    for r in rows:
        out[f"dead_{r['relname']}"] = r["n_dead_tup"]
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _with_options(stmt: str, options: str) -> str:
    """``VACUUM t`` as ``VACUUM (options) t`` (unchanged without options)."""
    return stmt.replace("VACUUM ", f"VACUUM ({options}) ", 1) if options else stmt


async def _vacuum_loop(run: Run, every: float, options: str) -> None:
    conn = await asyncpg.connect(run.dsn)
    try:
        while True:
            await asyncio.sleep(every)
            for stmt in run.layout.vacuum:
                await conn.execute(_with_options(stmt, options))
    finally:
        await conn.close()


async def _phase(
    run: Run, name: str, rate: float, seconds: float, vacuum_every: float, options: str = ""
) -> dict[str, Any]:
    mon = await asyncpg.connect(run.dsn)
    samples: list[dict[str, Any]] = []
    first = len(run.latencies)
    done0 = run.completed
    t0 = time.monotonic()
    producer = asyncio.create_task(run.produce(rate, seconds))
    vacuums = (
        asyncio.create_task(_vacuum_loop(run, vacuum_every, options)) if vacuum_every else None
    )
    while not producer.done():
        await asyncio.sleep(1.0)
        s = await _sample(mon, run.layout.relations)
        window = [v for when, v in run.latencies[first:] if when > time.monotonic() - 1.0]
        s["t"] = round(time.monotonic() - t0, 1)
        s["claim_p99_ms"] = round(_pct(window, 0.99) * 1000, 2)
        samples.append(s)
    await producer
    if vacuums is not None:
        vacuums.cancel()
        await asyncio.gather(vacuums, return_exceptions=True)
    elapsed = time.monotonic() - t0
    await mon.close()
    lat = [v for _, v in run.latencies[first:]]
    last = samples[-5:] if len(samples) >= 5 else samples
    return {
        "phase": name,
        "jobs_per_s": round((run.completed - done0) / elapsed),
        "claim_p50_ms": round(_pct(lat, 0.5) * 1000, 2),
        "claim_p99_ms": round(_pct(lat, 0.99) * 1000, 2),
        "claim_p99_last5s_ms": round(
            statistics.fmean(s["claim_p99_ms"] for s in last) if last else float("nan"), 2
        ),
        "dead_peak": max((s["dead"] for s in samples), default=0),
        "bytes_end": samples[-1]["bytes"] if samples else 0,
        "dead_end_by_relation": {
            k[5:]: v for k, v in (samples[-1] if samples else {}).items() if k.startswith("dead_")
        },
        "autovacuums": samples[-1]["autovacuums"] if samples else 0,
        "samples": samples,
    }


async def _drain(run: Run, n: int) -> dict[str, Any]:
    conn = await asyncpg.connect(run.dsn)
    for start in range(0, n, 5000):
        await run.insert(conn, 10_000_000 + start, min(5000, n - start))
    await conn.execute("VACUUM ANALYZE")
    await conn.execute("CHECKPOINT")
    backend = await conn.fetchval("SELECT pg_backend_pid()")
    before = {pid: cpu_seconds([pid]) for pid in server_pids(backend)}
    run.target = run.completed + n
    t0 = time.monotonic()
    run.stop.clear()
    worker = asyncio.create_task(run.work())
    await run.reached.wait()
    elapsed = time.monotonic() - t0
    # Read before the worker's connections close; the backends that started
    # during the drain (the worker's) count in full.
    pids = server_pids(backend)
    cpu = sum(cpu_seconds([pid]) - before.get(pid, 0.0) for pid in pids)
    run.stop.set()
    await worker
    await conn.close()
    return {
        "phase": "drain",
        "jobs_per_s": round(n / elapsed),
        "server_cpu_us_per_job": round(cpu / n * 1e6, 1) if pids else None,
    }


async def run_layout(server_dsn: str, layout: Layout, args: argparse.Namespace) -> dict[str, Any]:
    db = f"layout_{layout.name}"
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f"DROP DATABASE IF EXISTS {db}")
    await admin.execute(f"CREATE DATABASE {db}")
    await admin.close()
    dsn = _with_database(server_dsn, db)
    conn = await asyncpg.connect(dsn)
    for stmt in layout.ddl:
        await conn.execute(stmt)
    run = Run(layout, dsn)
    worker = asyncio.create_task(run.work())
    phases = [
        await _phase(
            run, "clean", args.rate, args.phase_seconds, args.vacuum_every, args.vacuum_options
        )
    ]
    holder = await asyncpg.connect(dsn)
    await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    await holder.fetchval("SELECT txid_current()")
    phases.append(
        await _phase(
            run, "pinned", args.rate, args.phase_seconds, args.vacuum_every, args.vacuum_options
        )
    )
    await holder.execute("ROLLBACK")
    await holder.close()
    run.stop.set()
    await worker
    phases.append(await _drain(run, args.drain_n))
    lost = await conn.fetchval("SELECT count(*) FROM jobs WHERE status <> 'completed'")
    await conn.close()
    return {"layout": layout.name, "not_completed": lost, "phases": phases}


async def vacuum_cost(
    server_dsn: str, retained: int, rounds: int = 3, options: str = ""
) -> dict[str, list[float]]:
    """Wall time of the layout's own VACUUM with ``retained`` finished rows
    kept, after each round of 2,000 jobs claimed and completed."""
    out: dict[str, list[float]] = {}
    for name in ("current", "moved"):
        layout = LAYOUTS[name]
        db = f"vacuum_{name}"
        admin = await asyncpg.connect(server_dsn)
        await admin.execute(f"DROP DATABASE IF EXISTS {db}")
        await admin.execute(f"CREATE DATABASE {db}")
        await admin.close()
        conn = await asyncpg.connect(_with_database(server_dsn, db))
        for stmt in layout.ddl:
            await conn.execute(stmt)
        done_table = "jobs_done" if name == "moved" else "jobs"
        await conn.execute(
            f"INSERT INTO {done_table} (job_id, task_name, task_data, status, finished_at)"
            " SELECT 'old' || i, 'noop', $2, 'completed', now() FROM generate_series(1, $1) i",
            retained,
            _PAYLOAD,
        )
        await conn.execute("VACUUM ANALYZE")
        times = []
        for r in range(rounds):
            ids = [f"r{r}_{i}" for i in range(2000)]
            await conn.execute(
                "INSERT INTO jobs (job_id, task_name, task_data)"
                " SELECT i, 'noop', $2 FROM unnest($1::text[]) i",
                ids,
                _PAYLOAD,
            )
            await conn.execute("UPDATE jobs SET status = 'running' WHERE job_id = ANY($1)", ids)
            await conn.execute(layout.complete, ids)
            t0 = time.perf_counter()
            for stmt in layout.vacuum:
                await conn.execute(_with_options(stmt, options))
            times.append(round((time.perf_counter() - t0) * 1000, 1))
        await conn.close()
        out[name] = times
        print(name, "VACUUM ms", times, flush=True)
    return out


def _with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = None
    dsn = args.dsn
    if dsn is None:
        from pg_scheduler.embedded import EmbeddedPostgres

        server = EmbeddedPostgres(tempfile.mkdtemp(prefix="pg_sched_layouts_"))
        dsn = server.dsn
    try:
        if args.vacuum_cost_rows:
            return {
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "retained": args.vacuum_cost_rows,
                "vacuum_options": args.vacuum_options,
                "vacuum_ms": await vacuum_cost(
                    dsn, args.vacuum_cost_rows, options=args.vacuum_options
                ),
            }
        results = []
        for name in args.layouts.split(","):
            res = await run_layout(dsn, LAYOUTS[name], args)
            results.append(res)
            for p in res["phases"]:
                row = {k: v for k, v in p.items() if k != "samples"}
                print(name, json.dumps(row), flush=True)
        return {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "rate": args.rate,
            "phase_seconds": args.phase_seconds,
            "vacuum_every": args.vacuum_every,
            "vacuum_options": args.vacuum_options,
            "results": results,
        }
    finally:
        if server is not None:
            server.stop()


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--phase-seconds", type=float, default=60.0)
    p.add_argument("--drain-n", type=int, default=50_000)
    p.add_argument("--vacuum-every", type=float, default=0.0, help="seconds; 0: autovacuum only")
    p.add_argument(
        "--vacuum-cost-rows",
        type=int,
        default=0,
        help="instead: time the own VACUUM of current and moved with N finished rows kept",
    )
    p.add_argument("--vacuum-options", default="", help='options of that VACUUM, e.g. "PARALLEL 0"')
    p.add_argument("--dsn")
    p.add_argument("--json")
    args = p.parse_args()
    out = asyncio.run(main(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    cli()
