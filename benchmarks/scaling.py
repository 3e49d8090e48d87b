"""Scaling on one PostgreSQL: 1, 2 and 4 worker processes, directly and
through pgbouncer in transaction mode.

``python -m benchmarks.scaling [--jobs 50000] [--dsn DSN] [--no-bouncer]
[--no-work-runs] [--bouncer-pool-size 20]`` from the repository root. One
embedded server (or ``--dsn``: a server on this machine for the CPU figures),
a fresh database per configuration. Each configuration:

1. ``--jobs`` no-op jobs bulk-enqueued with no worker running, then
   ``VACUUM ANALYZE`` and ``CHECKPOINT``;
2. P worker processes (this module with ``--worker``), each one
   ``Scheduler(pool, max_concurrent_jobs=50, batch_claim_limit=50)`` on an
   asyncpg pool of 2..10 connections, built and waiting; through pgbouncer the
   pool has ``statement_cache_size=0``, the Scheduler ``pgbouncer=True`` and
   ``listen_dsn`` a direct connection (docs/operations.md, pgbouncer);
3. all are told to start at once; the drain ends when no job is pending or
   running (polled every 50 ms on a separate direct connection, which also
   samples ``pg_stat_activity`` and ``pg_notification_queue_usage()`` and
   LISTENs on every channel of the schema to count notifications).

Measured per configuration: jobs/s (wall time from the start signal to the
last job done); PostgreSQL CPU per job (every process of the server, from
/proc: benchmarks/server_cpu.py); worker CPU per job (the worker processes,
from /proc); pgbouncer CPU per job; WAL bytes per job
(``pg_current_wal_lsn()`` before and after); the peak of server connections
to the database (and of those active); notifications per job by channel; the
peak notification queue usage. ``cores`` columns: CPU seconds per wall
second, i.e. how many cores that part kept busy.

A table goes to stdout, the figures as JSON to
``benchmarks/results/scaling-<UTC time>.json`` with the machine, the date,
the commit and the versions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg

from benchmarks.checkouts import admin, database_dsn, server_dsn
from benchmarks.server_cpu import cpu_seconds, server_pids
from pg_scheduler import JobSpec, Scheduler, task

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROCESSES = (1, 2, 4)
#: Every NOTIFY channel of the public schema (store/names.py).
CHANNELS = (
    "pg_scheduler_jobs",
    "pg_scheduler_events",
    "pg_scheduler_cancel",
    "pg_scheduler_queues",
)
WORKER_SETTINGS: dict[str, Any] = {
    "max_concurrent_jobs": 50,
    "batch_claim_limit": 50,
    "vacuum_enabled": False,
    "run_periodic_jobs": False,
}
_ran = 0


@task(name="bench.scaling.noop")
async def noop(i: int) -> None:
    global _ran
    _ran += 1


@task(name="bench.scaling.work")
async def work(i: int, ms: float) -> None:
    """A job that waits ``ms`` milliseconds (I/O-like work: no CPU)."""
    global _ran
    await asyncio.sleep(ms / 1000)
    _ran += 1


# -- the worker process ----------------------------------------------------------------


async def worker_main(dsn: str, bouncer: bool, listen_dsn: str | None) -> None:
    """Build the Scheduler, say READY, start on the first stdin line, shut
    down on the second, print ``RESULT {"ran": n}``."""
    options: dict[str, Any] = {"min_size": 2, "max_size": 10}
    if bouncer:
        options["statement_cache_size"] = 0
    pool = await asyncpg.create_pool(dsn, **options)
    scheduler = Scheduler(pool, pgbouncer=bouncer, listen_dsn=listen_dsn, **WORKER_SETTINGS)
    loop = asyncio.get_running_loop()
    print("READY", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    await scheduler.start()
    await loop.run_in_executor(None, sys.stdin.readline)
    await scheduler.shutdown(grace_period=5)
    await pool.close()
    print("RESULT " + json.dumps({"ran": _ran}), flush=True)


# -- pgbouncer --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bouncer:
    """A pgbouncer (pool_mode=transaction) before ``dsn``'s server, every
    database passed through (``* =``); :meth:`url` for one database."""

    def __init__(self, dsn: str, pool_size: int) -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not os.access(binary, os.X_OK):
            raise SystemExit("pgbouncer is not installed (Debian: apt-get install -y pgbouncer)")
        parts = urlsplit(dsn)
        query = parse_qs(parts.query)
        host = query.get("host", [parts.hostname or "127.0.0.1"])[0]
        port = parts.port or int(query.get("port", ["5432"])[0])
        self.user = parts.username or "postgres"
        self.port = _free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="pgs-scaling-bouncer-"))
        (self.workdir / "userlist.txt").write_text(f'"{self.user}" "{parts.password or ""}"\n')
        (self.workdir / "pgbouncer.ini").write_text(
            f"""
[databases]
* = host={host} port={port}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.workdir / "userlist.txt"}
pool_mode = transaction
max_client_conn = 1000
default_pool_size = {pool_size}
ignore_startup_parameters = extra_float_digits
"""
        )
        command = [binary, str(self.workdir / "pgbouncer.ini")]
        if os.geteuid() == 0:  # pgbouncer refuses root: run as the socket's owner
            owner = (
                pwd.getpwuid(os.stat(host).st_uid).pw_name if host.startswith("/") else "postgres"
            )
            shutil.chown(self.workdir, owner)
            for f in self.workdir.iterdir():
                shutil.chown(f, owner)
            command[1:1] = ["-u", owner]
        self.log = open(self.workdir / "pgbouncer.log", "wb")
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        self.version = subprocess.run(
            [binary, "--version"], capture_output=True, text=True
        ).stdout.splitlines()[0]

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    async def ready(self, database: str) -> None:
        deadline = time.monotonic() + 15
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError((self.workdir / "pgbouncer.log").read_text()[-2000:])
            try:
                conn = await asyncpg.connect(self.url(database), statement_cache_size=0, timeout=2)
            except (OSError, asyncpg.PostgresError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
                continue
            await conn.close()
            return

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


# -- one configuration ------------------------------------------------------------------


class Monitor:
    """A direct connection that counts notifications and samples the server."""

    def __init__(self, conn: asyncpg.Connection, database: str) -> None:
        self.conn = conn
        self.database = database
        self.notes: dict[str, int] = dict.fromkeys(CHANNELS, 0)
        self.peak_connections = 0
        self.peak_active = 0
        self.peak_queue_usage = 0.0

    def _count(self, _conn: object, _pid: int, channel: str, _payload: str) -> None:
        self.notes[channel] += 1

    async def listen(self) -> None:
        for channel in CHANNELS:
            await self.conn.add_listener(channel, self._count)

    async def sample(self) -> bool:
        """One sample; True when no job is pending or running."""
        row = await self.conn.fetchrow(
            """
            SELECT (SELECT count(*) FROM pg_stat_activity
                     WHERE datname = $1 AND backend_type = 'client backend'
                       AND pid <> pg_backend_pid()) AS connections,
                   (SELECT count(*) FROM pg_stat_activity
                     WHERE datname = $1 AND backend_type = 'client backend'
                       AND state = 'active' AND pid <> pg_backend_pid()) AS active,
                   pg_notification_queue_usage() AS queue_usage,
                   NOT EXISTS (SELECT 1 FROM scheduled_jobs
                                WHERE status IN ('pending', 'running')) AS done
            """,
            self.database,
        )
        self.peak_connections = max(self.peak_connections, row["connections"])
        self.peak_active = max(self.peak_active, row["active"])
        self.peak_queue_usage = max(self.peak_queue_usage, row["queue_usage"])
        return bool(row["done"])


async def _worker(url: str, bouncer: bool, listen_dsn: str | None) -> asyncio.subprocess.Process:
    args = [sys.executable, "-m", "benchmarks.scaling", "--worker", url]
    if bouncer:
        args += ["--worker-bouncer", "--worker-listen", listen_dsn or ""]
    proc = await asyncio.create_subprocess_exec(
        *args,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if line.strip() != b"READY":
        raise RuntimeError(f"a worker did not start: {line!r}")
    return proc


def _tell(procs: list[asyncio.subprocess.Process]) -> None:
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(b"go\n")


async def run_one(
    dsn: str,
    n: int,
    processes: int,
    bouncer: Bouncer | None,
    work_ms: float,
    timeout: float,
) -> dict[str, Any]:
    name = f"scaling_{uuid.uuid4().hex[:8]}"
    await admin(dsn, f'CREATE DATABASE "{name}"')
    direct = database_dsn(dsn, name)
    procs: list[asyncio.subprocess.Process] = []
    pool = await asyncpg.create_pool(direct, min_size=1, max_size=4)
    monitor_conn = await asyncpg.connect(direct)
    try:
        await Scheduler(pool).initialize_db()
        when = datetime.now(UTC) - timedelta(seconds=1)
        if work_ms:
            specs = [JobSpec(work, when, (i, work_ms)) for i in range(n)]
        else:
            specs = [JobSpec(noop, when, (i,)) for i in range(n)]
        await Scheduler(pool, run_periodic_jobs=False).schedule_bulk(specs)
        await pool.execute("VACUUM ANALYZE")
        await pool.execute("CHECKPOINT")
        if bouncer is not None:
            await bouncer.ready(name)
        url = bouncer.url(name) if bouncer is not None else direct
        procs = [
            await _worker(url, bouncer is not None, direct if bouncer else None)
            for _ in range(processes)
        ]
        monitor = Monitor(monitor_conn, name)
        await monitor.listen()
        own = monitor_conn.get_server_pid()
        pids = [p for p in server_pids(own) if p != own]
        worker_pids = [p.pid for p in procs]
        wal0 = await monitor_conn.fetchval("SELECT pg_current_wal_lsn()")
        server0 = cpu_seconds(pids)
        workers0 = cpu_seconds(worker_pids)
        bouncer0 = cpu_seconds([bouncer.proc.pid]) if bouncer is not None else 0.0
        started = time.perf_counter()
        _tell(procs)
        deadline = started + timeout
        while not await monitor.sample():
            if time.perf_counter() > deadline:
                raise RuntimeError(f"not drained in {timeout} s")
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - started
        # Backends opened meanwhile count from zero; they are still open.
        now_pids = [p for p in server_pids(own) if p != own]
        server = cpu_seconds(pids + [p for p in now_pids if p not in pids]) - server0
        workers = cpu_seconds(worker_pids) - workers0
        bouncer_cpu = cpu_seconds([bouncer.proc.pid]) - bouncer0 if bouncer is not None else None
        wal = await monitor_conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)", wal0)
        span = await monitor_conn.fetchval(
            "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8"
            " FROM scheduled_jobs"
        )
        completed = await monitor_conn.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'"
        )
        _tell(procs)
        ran = []
        for p in procs:
            out, _ = await asyncio.wait_for(p.communicate(), 60)
            lines = [x for x in out.decode().splitlines() if x.startswith("RESULT ")]
            ran.append(json.loads(lines[0][7:])["ran"] if lines else None)
        procs = []
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
        await monitor_conn.close()
        await pool.close()
        await admin(dsn, f'DROP DATABASE "{name}" WITH (FORCE)')
    per_job = 1e6 / n
    return {
        "processes": processes,
        "pgbouncer": bouncer is not None,
        "work_ms": work_ms,
        "jobs": n,
        "completed": completed,
        "ran_per_process": ran,
        "seconds": round(elapsed, 3),
        "jobs_per_s": round(n / elapsed),
        "claim_to_finish_span_s": round(span, 3) if span else None,
        "server_cpu_us_per_job": round(server * per_job, 1) if pids else None,
        "worker_cpu_us_per_job": round(workers * per_job, 1),
        "pgbouncer_cpu_us_per_job": (
            None if bouncer_cpu is None else round(bouncer_cpu * per_job, 1)
        ),
        "server_cores": round(server / elapsed, 2) if pids else None,
        "worker_cores": round(workers / elapsed, 2),
        "pgbouncer_cores": None if bouncer_cpu is None else round(bouncer_cpu / elapsed, 2),
        "wal_bytes_per_job": round(float(wal) / n, 1),
        "peak_server_connections": monitor.peak_connections,
        "peak_active_connections": monitor.peak_active,
        "notifications_per_job": {
            k.removeprefix("pg_scheduler_"): round(v / n, 4) for k, v in monitor.notes.items()
        },
        "peak_notification_queue_usage": monitor.peak_queue_usage,
    }


# -- the whole run ----------------------------------------------------------------------


def _saturation(row: dict[str, Any], cores: int) -> str:
    """Which part was busiest, as a share of the machine's cores."""
    parts = {
        "postgres": row["server_cores"] or 0.0,
        "workers": row["worker_cores"],
        "pgbouncer": row["pgbouncer_cores"] or 0.0,
    }
    used = sum(parts.values())
    top = max(parts, key=lambda k: parts[k])
    if used >= 0.85 * cores:
        return f"CPU-bound ({used:.2f}/{cores} cores), most: {top}"
    if top == "workers" and parts["workers"] >= 0.85 * row["processes"]:
        return "workers (each process at one core)"
    return f"{top} ({parts[top]:.2f} cores)"


def _table(rows: list[dict[str, Any]], cores: int) -> str:
    head = (
        f"{'procs':>5} {'bouncer':>7} {'work':>5} {'jobs/s':>8} {'pg us/job':>9} "
        f"{'wk us/job':>9} {'pgb us/job':>10} {'pg cores':>8} {'wk cores':>8} "
        f"{'WAL B/job':>9} {'conns':>5} {'active':>6} {'notify/job':>10}  saturates"
    )
    lines = [head, "-" * len(head)]

    def f(v: Any) -> str:
        return "-" if v is None else str(v)

    for r in rows:
        notes = round(sum(r["notifications_per_job"].values()), 3)
        lines.append(
            f"{r['processes']:>5} {('yes' if r['pgbouncer'] else 'no'):>7} "
            f"{(str(r['work_ms']) + 'ms' if r['work_ms'] else '-'):>5} {r['jobs_per_s']:>8} "
            f"{f(r['server_cpu_us_per_job']):>9} {r['worker_cpu_us_per_job']:>9} "
            f"{f(r['pgbouncer_cpu_us_per_job']):>10} {f(r['server_cores']):>8} "
            f"{r['worker_cores']:>8} {r['wal_bytes_per_job']:>9} "
            f"{r['peak_server_connections']:>5} {r['peak_active_connections']:>6} "
            f"{notes:>10}  {_saturation(r, cores)}"
        )
    return "\n".join(lines)


def _commit() -> str | None:
    """HEAD, with ``+changes`` when the work tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if changed else "")


async def main(args: argparse.Namespace) -> None:
    dsn = server_dsn(args.dsn, "pgs-scaling-")
    cores = os.cpu_count() or 1
    configs: list[tuple[int, bool, float]] = [(p, False, 0.0) for p in PROCESSES]
    if not args.no_bouncer:
        configs += [(p, True, 0.0) for p in PROCESSES]
    if not args.no_work_runs:
        configs += [(1, False, 1.0), (4, False, 1.0)]
    bouncer = None if args.no_bouncer else Bouncer(dsn, args.bouncer_pool_size)
    conn = await asyncpg.connect(dsn)
    try:
        pg_version = await conn.fetchval("SHOW server_version")
        settings = {
            r["name"]: r["setting"]
            for r in await conn.fetch(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1)",
                ["max_connections", "shared_buffers", "synchronous_commit", "fsync", "wal_level"],
            )
        }
    finally:
        await conn.close()
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        for processes, through, work_ms in configs:
            row = await run_one(
                dsn, args.jobs, processes, bouncer if through else None, work_ms, args.timeout
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if bouncer is not None:
            bouncer.stop()
    total = time.perf_counter() - started
    print()
    print(_table(rows, cores))
    print(f"\n{len(rows)} configurations, {args.jobs} jobs each, {total:.0f} s")
    result = {
        "benchmark": "scaling",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "machine": {
            "cpus": cores,
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "postgres": {"version": pg_version, "settings": settings},
        "pgbouncer": None if bouncer is None else bouncer.version,
        "method": __doc__.split("\n\n", 1)[1],
        "jobs": args.jobs,
        "seconds_total": round(total, 1),
        "results": rows,
    }
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    path = out / f"scaling-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {path.relative_to(ROOT)}")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50_000, help="jobs per drain (50000)")
    parser.add_argument("--dsn", help="PostgreSQL server (default: an embedded one)")
    parser.add_argument("--no-bouncer", action="store_true", help="direct connections only")
    parser.add_argument("--no-work-runs", action="store_true", help="leave out the 1 ms jobs")
    parser.add_argument(
        "--bouncer-pool-size", type=int, default=20, help="pgbouncer default_pool_size (20)"
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per drain at most")
    parser.add_argument("--worker", metavar="DSN", help=argparse.SUPPRESS)
    parser.add_argument("--worker-bouncer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-listen", help=argparse.SUPPRESS)
    return parser.parse_args()


if __name__ == "__main__":
    arguments = _arguments()
    if arguments.worker:
        import logging

        import structlog

        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
            cache_logger_on_first_use=True,
        )
        asyncio.run(
            worker_main(arguments.worker, arguments.worker_bouncer, arguments.worker_listen or None)
        )
    else:
        asyncio.run(main(arguments))
