"""The orchestrator of a sustained run (see the package docstring)."""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import csv
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from array import array
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.__main__ import CONTENDERS as DRAIN_CONTENDERS
from benchmarks.__main__ import RESULTS, Server, venv_python
from benchmarks.sustained.proc import PRODUCED, RAN

HERE = Path(__file__).resolve().parent
PROC = HERE / "proc.py"
PLOT = HERE / "plot.py"
PHASES = [
    "warmup",
    "clean",
    "idle_in_transaction",
    "readers",
    "rate_x1_5",
    "restart",
    "kill",
    "recovery",
]
WORKERS = 2
READERS = 4
CAPACITY_DEPTH = 1000  # queue depth the capacity measurement keeps
P99_TARGET_MS = 20.0
RECOVERY_TARGET_S = 10.0
# Peers run in their own virtualenv (the drain harness's pins); any other
# contender module runs in this interpreter (this repository's venv: asyncpg).
REQUIREMENTS = {n: DRAIN_CONTENDERS[n] for n in ("pgqueuer", "procrastinate")}


def contender_names() -> list[str]:
    return sorted(p.stem for p in (HERE / "contenders").glob("*.py") if p.stem != "__init__")


def pct(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def spread(values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    return {
        f"claim_{k}_ms": (round(v, 2) if v is not None else None)
        for k, v in (
            ("p50", pct(ordered, 0.5)),
            ("p95", pct(ordered, 0.95)),
            ("p99", pct(ordered, 0.99)),
        )
    }


# -- the server ------------------------------------------------------------------


class Postgres(Server):
    """The drain harness's server, and a way to restart it."""

    def __init__(self, dsn: str | None, pg_ctl_datadir: str | None) -> None:
        super().__init__(dsn)
        self.pg_ctl_datadir = pg_ctl_datadir

    @property
    def can_restart(self) -> bool:
        return self._embedded is not None or self.pg_ctl_datadir is not None

    def restart(self) -> None:
        """pg_ctl restart -m fast (sessions are terminated; a clean shutdown)."""
        if self._embedded is not None:
            from pgserver._commands import POSTGRES_BIN_PATH

            inner = self._embedded._server
            pgdata = Path(inner.pgdata)
            pg_ctl, user = str(POSTGRES_BIN_PATH / "pg_ctl"), inner.system_user
        else:
            assert self.pg_ctl_datadir is not None
            pgdata, pg_ctl, user = Path(self.pg_ctl_datadir), "pg_ctl", None
        subprocess.run(
            [
                pg_ctl,
                "-D",
                str(pgdata),
                "-w",
                "-t",
                "60",
                "-m",
                "fast",
                "restart",
                "-l",
                str(pgdata / "restart.log"),
            ],
            check=True,
            user=user,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )


# -- what the processes wrote ----------------------------------------------------


class Tail:
    """New whole records of a growing file."""

    def __init__(self, path: Path, record: Any) -> None:
        self.path, self.record, self.offset = path, record, 0

    def read(self) -> list[tuple[Any, ...]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        whole = len(data) - len(data) % self.record.size
        self.offset += whole
        return list(self.record.iter_unpack(data[:whole]))


class Records:
    """Every job run and every job produced, compact (arrays, not objects)."""

    def __init__(self) -> None:
        self.runs = array("I")  # runs per id
        self.produced_ids: set[int] = set()  # ids the producer confirmed
        self.outstanding: set[int] = set()  # ... that have not run yet
        self.end = array("d")  # handler end times, in reading order
        self.start = array("d")
        self.latency_ms = array("d")
        self.enqueued = array("d")  # enqueue-call return times
        self.window_lat: list[float] = []
        self.window_done = 0
        self.window_enq = 0
        self.unknown = (
            0  # runs of ids the producer never confirmed (an enqueue retried after a commit)
        )

    def add_runs(self, rows: list[tuple[Any, ...]]) -> None:
        for i, offered, start, end in rows:
            if i >= len(self.runs):
                self.runs.extend(array("I", bytes(4 * (i + 1 - len(self.runs) + 10_000))))
            self.runs[i] += 1
            self.outstanding.discard(i)
            self.end.append(end)
            self.start.append(start)
            lat = (start - offered) * 1000
            self.latency_ms.append(lat)
            self.window_lat.append(lat)
        self.window_done += len(rows)

    def add_produced(self, rows: list[tuple[Any, ...]]) -> None:
        for i, _offered, done in rows:
            self.produced_ids.add(i)
            if i >= len(self.runs) or not self.runs[i]:
                self.outstanding.add(i)
            self.enqueued.append(done)
        self.window_enq += len(rows)

    def take_window(self) -> tuple[list[float], int, int]:
        out = (self.window_lat, self.window_done, self.window_enq)
        self.window_lat, self.window_done, self.window_enq = [], 0, 0
        return out

    def check(self) -> dict[str, Any]:
        missing = [i for i in self.produced_ids if i >= len(self.runs) or self.runs[i] == 0]
        dups = sum(1 for i in self.produced_ids if i < len(self.runs) and self.runs[i] > 1)
        extra = sum(1 for i, n in enumerate(self.runs) if n and i not in self.produced_ids)
        return {
            "produced": len(self.produced_ids),
            "ran": sum(1 for i in self.produced_ids if i < len(self.runs) and self.runs[i]),
            "missing": len(missing),
            "missing_ids_sample": sorted(missing)[:20],
            "duplicated": dups,
            "ran_but_unconfirmed": extra,
        }


# -- one contender's run ---------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace, server: Postgres, name: str, out: Path) -> None:
        self.args, self.server, self.name = args, server, name
        self.dir = out / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.python = venv_python(name, REQUIREMENTS.get(name))
        self.records = Records()
        self.tails: list[Tail] = []
        self.events: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.phase = "setup"
        self.phase_start = time.time()
        self.phase_bounds: dict[str, tuple[float, float]] = {}
        self.t0 = time.time()
        self.workers: list[asyncio.subprocess.Process | None] = [None] * WORKERS
        self.spawned = 0
        self.killing: set[int] = set()  # pids this harness killed on purpose
        self.stopping = False
        self.sampler_conn: asyncpg.Connection | None = None
        self.relations: list[dict[str, Any]] = []
        self.restart_at: tuple[float, float] | None = None
        self.watchers: list[asyncio.Task[None]] = []

    def cfg(self, **extra: Any) -> str:
        return json.dumps({"dsn": self.dsn, "options": self.options, **extra})

    def event(self, kind: str, **data: Any) -> None:
        e = {"t": round(time.time() - self.t0, 3), "phase": self.phase, "event": kind, **data}
        self.events.append(e)
        print(f"  [{self.name}] {kind} {json.dumps(data)[:200]}", flush=True)

    # processes

    async def spawn(self, role: str, records: Path, log: Path) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            self.python,
            str(PROC),
            self.name,
            role,
            self.cfg(records=str(records)),
            stdin=asyncio.subprocess.PIPE if role == "producer" else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=log.open("ab"),
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        if line.strip() != b"READY":
            raise RuntimeError(f"{role} did not start: {line!r}; see {log}")
        return proc

    async def spawn_worker(self, slot: int) -> None:
        self.spawned += 1
        records = self.dir / f"worker-{self.spawned}.bin"
        self.tails.append(Tail(records, RAN))
        proc = await self.spawn("worker", records, self.dir / f"worker-{self.spawned}.log")
        self.workers[slot] = proc
        self.watchers.append(asyncio.create_task(self.watch(slot, proc, self.spawned)))

    async def watch(self, slot: int, proc: asyncio.subprocess.Process, number: int) -> None:
        """A worker that exits by itself is recorded and replaced (a supervisor's job)."""
        code = await proc.wait()
        if proc.pid in self.killing or self.stopping:
            return
        log = (self.dir / f"worker-{number}.log").read_text(errors="replace")[-600:]
        self.event("worker_exited_by_itself", slot=slot, code=code, log_tail=log)
        if self.workers[slot] is proc:
            await self.spawn_worker(slot)

    async def kill_one(self, slot: int) -> None:
        proc = self.workers[slot]
        assert proc is not None
        self.killing.add(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
        self.event("worker_sigkill", slot=slot, pid=proc.pid, code=proc.returncode, at=time.time())
        await self.spawn_worker(slot)

    async def command(self, line: str) -> None:
        assert self.producer.stdin is not None
        self.producer.stdin.write(line.encode() + b"\n")
        await self.producer.stdin.drain()

    # sampling

    async def db(self) -> asyncpg.Connection:
        if self.sampler_conn is None or self.sampler_conn.is_closed():
            self.sampler_conn = await asyncpg.connect(self.dsn, timeout=3)
        return self.sampler_conn

    async def discover(self) -> None:
        conn = await self.db()
        wanted = self.describe.get("relations")
        rows = await conn.fetch(
            """
            SELECT c.oid, n.nspname || '.' || c.relname AS name, c.relkind::text AS kind
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.relkind IN ('r', 'p')
              AND n.nspname NOT IN ('pg_catalog', 'information_schema')
              AND n.nspname NOT LIKE 'pg_toast%'
              AND ($1::text[] IS NULL OR c.relname = ANY($1)
                   OR n.nspname || '.' || c.relname = ANY($1))
            UNION ALL
            SELECT i.indexrelid, n.nspname || '.' || c.relname, 'i'
            FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
            JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
              AND n.nspname NOT LIKE 'pg_toast%'
              AND ($1::text[] IS NULL OR t.relname = ANY($1)
                   OR n.nspname || '.' || t.relname = ANY($1))
            ORDER BY 3 DESC, 2
            """,
            wanted,
        )
        self.relations = [dict(r) for r in rows]
        table = self.describe["job_table"]
        self.job_table = next(
            (
                r["name"]
                for r in self.relations
                if r["kind"] != "i" and r["name"].split(".")[-1] == table
            ),
            table,
        )

    async def sample_db(self) -> dict[str, Any]:
        row: dict[str, Any] = {}
        try:
            conn = await self.db()
            oids = [r["oid"] for r in self.relations]
            stats = await conn.fetch(
                """
                SELECT c.oid, s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.vacuum_count,
                       pg_relation_size(c.oid) AS size, pg_total_relation_size(c.oid) AS total
                FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
                WHERE c.oid = ANY($1::oid[])
                """,
                oids,
            )
            names = {r["oid"]: r for r in self.relations}
            for s in stats:
                rel = names[s["oid"]]
                if rel["kind"] == "i":
                    row[f"{rel['name']}:size"] = s["size"]
                    continue
                for key in (
                    "n_live_tup",
                    "n_dead_tup",
                    "autovacuum_count",
                    "vacuum_count",
                    "size",
                    "total",
                ):
                    row[f"{rel['name']}:{key}"] = s[key]
            row["xmin_age"] = await conn.fetchval(
                "SELECT max(greatest(age(backend_xmin), age(backend_xid))) FROM pg_stat_activity"
            )
            row["depth"] = await conn.fetchval(self.describe["depth_sql"])
        except (
            OSError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            # A connection left mid-operation (its server restarted under it):
            # dropped, and a fresh one for the next sample.
            asyncpg.InternalClientError,
            TimeoutError,
        ) as exc:
            row["db_error"] = type(exc).__name__
            if self.sampler_conn is not None:
                self.sampler_conn.terminate()
            self.sampler_conn = None
        return row

    def read_records(self) -> None:
        self.records.add_produced(self.producer_tail.read())
        for tail in self.tails:
            self.records.add_runs(tail.read())

    async def sampler(self) -> None:
        last = time.time()
        while True:
            await asyncio.sleep(self.args.sample_seconds)
            self.read_records()
            now = time.time()
            lat, done, enq = self.records.take_window()
            span = max(1e-6, now - last)
            last = now
            row = {
                "t": round(now - self.t0, 3),
                "phase": self.phase,
                "t_phase": round(now - self.phase_start, 3),
                "enqueued_per_s": round(enq / span, 1),
                "completed_per_s": round(done / span, 1),
                "jobs_in_window": done,
                **spread(lat),
                **await self.sample_db(),
            }
            self.samples.append(row)

    # phases

    async def idle_in_transaction(self, stop: asyncio.Event) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            xid = await conn.fetchval("SELECT txid_current()")
            self.event("idle_in_transaction_open", xid=xid)
            await stop.wait()
            await conn.execute("ROLLBACK")
        finally:
            await conn.close()

    async def reader(self, stop: asyncio.Event, loops: list[int]) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            while not stop.is_set():
                await conn.fetchval(f"SELECT count(*) FROM {self.job_table}")
                loops[0] += 1
        finally:
            await conn.close()

    async def restart(self) -> None:
        await asyncio.sleep(min(5.0, self.args.phase_seconds * 0.2))
        if not self.server.can_restart:
            self.event("restart_skipped", reason="no --pg-ctl-datadir with --dsn")
            return
        before = await self.postmaster_start()
        begin = time.time()
        self.event("postgres_restart_begin", postmaster_start=before)
        await asyncio.to_thread(self.server.restart)
        back = time.time()
        self.restart_at = (begin, back)
        self.event(
            "postgres_restart_done",
            downtime_s=round(back - begin, 2),
            postmaster_start=await self.postmaster_start(),
        )

    async def postmaster_start(self) -> str:
        conn = await asyncpg.connect(self.dsn, timeout=10)
        try:
            return str(await conn.fetchval("SELECT pg_postmaster_start_time()"))
        finally:
            await conn.close()

    async def kills(self, stop: asyncio.Event) -> None:
        """kill -9 a worker every --kill-every seconds (at least once a phase)
        and start its replacement; a kill begun finishes before the phase ends."""
        every = min(self.args.kill_every, self.args.phase_seconds / 2)
        n = 0
        while True:
            try:
                await asyncio.wait_for(stop.wait(), every)
                return
            except TimeoutError:
                await self.kill_one(n % WORKERS)
                n += 1

    async def run_phase(self, name: str, rate: float) -> None:
        self.phase, self.phase_start = name, time.time()
        print(f"[{self.name}] phase {name} ({self.args.phase_seconds:.0f} s)", flush=True)
        depth_mode = self.args.depth_target is not None
        if depth_mode:
            target = self.args.depth_target * (1.5 if name == "rate_x1_5" else 1)
            await self.command(f"depth {target}")
        else:
            await self.command(f"rate {rate * (1.5 if name == 'rate_x1_5' else 1)}")
        stop = asyncio.Event()
        tasks: list[asyncio.Task[Any]] = []
        loops = [0]
        if name == "idle_in_transaction":
            tasks.append(asyncio.create_task(self.idle_in_transaction(stop)))
        elif name == "readers":
            tasks += [asyncio.create_task(self.reader(stop, loops)) for _ in range(READERS)]
        elif name == "restart":
            tasks.append(asyncio.create_task(self.restart()))
        elif name == "kill":
            tasks.append(asyncio.create_task(self.kills(stop)))
        await asyncio.sleep(self.args.phase_seconds)
        stop.set()
        for t in tasks:
            await t
        if name == "readers":
            self.event("readers_done", count_queries=loops[0])
        self.phase_bounds[name] = (self.phase_start, time.time())

    async def capacity(self) -> float:
        """Completed jobs/s of the workers with the queue kept CAPACITY_DEPTH deep."""
        self.phase, self.phase_start = "capacity", time.time()
        print(f"[{self.name}] capacity ({self.args.capacity_seconds:.0f} s)", flush=True)
        await self.command(f"depth {CAPACITY_DEPTH}")
        await asyncio.sleep(self.args.capacity_seconds * 0.25)
        self.read_records()
        n0, t0 = len(self.records.end), time.time()
        await asyncio.sleep(self.args.capacity_seconds * 0.75)
        self.read_records()
        rate = (len(self.records.end) - n0) / (time.time() - t0)
        await self.command("rate 0")
        # Drain the capacity backlog before the phases (poll the depth, with a deadline).
        deadline = time.time() + 120
        while time.time() < deadline:
            d = (await self.sample_db()).get("depth")
            if d is not None and d == 0:
                break
            await asyncio.sleep(0.2)
        self.phase_bounds["capacity"] = (self.phase_start, time.time())
        return rate

    async def drain_all(self) -> None:
        """After the producer stops: until every produced job ran, or no job ran for
        --final-wait seconds."""
        last_n, last_change = -1, time.time()
        while True:
            self.read_records()
            if not self.records.outstanding:
                return
            n = len(self.records.end)
            if n != last_n:
                last_n, last_change = n, time.time()
            elif time.time() - last_change > self.args.final_wait:
                return
            await asyncio.sleep(0.2)

    async def run(self) -> dict[str, Any]:
        self.db_name, self.dsn = await asyncio.to_thread(
            self.server.fresh_database, f"sus_{self.name}"
        )
        self.options = json.loads(self.args.options).get(self.name, {})
        install = await asyncio.create_subprocess_exec(
            self.python,
            str(PROC),
            self.name,
            "install",
            self.cfg(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await install.communicate()
        line = next((x for x in out.decode().splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"{self.name}: install failed: {err.decode()[-2000:]}")
        self.describe = json.loads(line[7:])
        print(f"[{self.name}] {self.describe['version']}", flush=True)
        await self.discover()
        self.producer_tail = Tail(self.dir / "producer.bin", PRODUCED)
        self.producer = await self.spawn(
            "producer", self.dir / "producer.bin", self.dir / "producer.log"
        )
        for slot in range(WORKERS):
            await self.spawn_worker(slot)
        sampler = asyncio.create_task(self.sampler())
        capacity = None
        try:
            if self.args.rate is None and self.args.depth_target is None:
                capacity = await self.capacity()
                rate = capacity * self.args.capacity_fraction
            elif self.args.rate is not None:
                if not self.args.skip_capacity:
                    capacity = await self.capacity()
                rate = self.args.rate
            else:
                rate = 0.0
            self.event("offered", rate=round(rate, 1), capacity=capacity and round(capacity, 1))
            await self.discover()  # tables a worker created at start
            for name in self.args.phases:
                await self.run_phase(name, rate)
            self.phase = "final_drain"
            await self.command("stop")
            assert self.producer.stdout is not None
            out_b = await asyncio.wait_for(self.producer.stdout.read(), 60)
            await self.producer.wait()
            produced = next(
                (json.loads(x[7:]) for x in out_b.decode().splitlines() if x.startswith("RESULT ")),
                {"error": "no producer result"},
            )
            await self.drain_all()
        finally:
            self.stopping = True
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            for proc in self.workers:
                if proc is not None and proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in self.workers:
                if proc is not None:
                    try:
                        await asyncio.wait_for(proc.wait(), 30)
                    except TimeoutError:
                        proc.kill()
            if self.producer.returncode is None:
                self.producer.kill()
            self.read_records()
            if self.sampler_conn is not None:
                await self.sampler_conn.close()
        self.write_csv()
        summary = self.summarize(rate, capacity)
        summary["producer"] = produced
        await asyncio.to_thread(self.server.drop, self.db_name)
        return summary

    # results

    def write_csv(self) -> None:
        keys: list[str] = []
        for row in self.samples:
            for k in row:
                if k not in keys:
                    keys.append(k)
        with (self.dir.parent / f"samples-{self.name}.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(self.samples)

    def completion_times(self) -> list[float]:
        return sorted(self.records.end)

    def recovery_s(
        self, ends: list[float], at: float, until: float, clean_rate: float
    ) -> float | None:
        """From ``at`` to the end of the first 1-second window with >= 90 % of the
        clean phase's completion rate (0 if the first window already has it)."""
        need = 0.9 * clean_rate
        t = at
        while t + 1 <= until:
            n = bisect.bisect_left(ends, t + 1) - bisect.bisect_left(ends, t)
            if n >= need:
                return 0.0 if t == at else round(t + 1 - at, 2)
            t += 0.1
        return None

    def summarize(self, rate: float, capacity: float | None) -> dict[str, Any]:
        ends = self.completion_times()
        starts = array("d", self.records.start)
        lat = self.records.latency_ms
        job_dead = f"{self.job_table}:n_dead_tup"
        phases: dict[str, Any] = {}
        for name, (b, e) in self.phase_bounds.items():
            in_phase = [lat[k] for k in range(len(starts)) if b <= starts[k] < e]
            done = bisect.bisect_left(ends, e) - bisect.bisect_left(ends, b)
            rows = [s for s in self.samples if s["phase"] == name]
            totals = [
                sum(v for k, v in s.items() if k.endswith(":total") and v is not None)
                for s in rows
                if not s.get("db_error")
            ]
            deads = [s.get(job_dead) for s in rows if s.get(job_dead) is not None]
            ages = [s.get("xmin_age") for s in rows if s.get("xmin_age") is not None]
            phases[name] = {
                "seconds": round(e - b, 1),
                "jobs": len(in_phase),
                **spread(in_phase),
                "throughput_per_s": round(done / (e - b), 1),
                "job_table_dead_tuples_peak": max(deads) if deads else None,
                # Beside the peak: an autoanalyze sets the count to an estimate
                # extrapolated from its sample until the next VACUUM, which a
                # single sample can catch.
                "job_table_dead_tuples_median": statistics.median(deads) if deads else None,
                "total_size_growth_bytes": (totals[-1] - totals[0]) if len(totals) > 1 else None,
                "xmin_age_max": max(ages) if ages else None,
            }
        clean = phases.get("clean", {})
        clean_rate = clean.get("throughput_per_s") or rate
        targets: dict[str, Any] = {}
        for name, p in phases.items():
            if name in ("restart", "kill", "capacity"):
                continue
            p99 = p["claim_p99_ms"]
            targets[f"p99_le_20ms:{name}"] = p99 is not None and p99 <= P99_TARGET_MS
        iit = phases.get("idle_in_transaction")
        if iit and clean.get("claim_p99_ms"):
            targets["idle_in_transaction_p99_within_2x_clean"] = (
                iit["claim_p99_ms"] is not None and iit["claim_p99_ms"] <= 2 * clean["claim_p99_ms"]
            )
            targets["idle_in_transaction_no_throughput_collapse"] = (
                iit["throughput_per_s"] >= 0.9 * clean["throughput_per_s"]
            )
        recoveries: list[dict[str, Any]] = []
        if self.restart_at is not None and "restart" in self.phase_bounds:
            until = self.phase_bounds["restart"][1]
            r = self.recovery_s(ends, self.restart_at[1], until, clean_rate)
            recoveries.append(
                {
                    "event": "restart",
                    "downtime_s": round(self.restart_at[1] - self.restart_at[0], 2),
                    "recovery_s": r,
                }
            )
        kill_times = [e["at"] for e in self.events if e["event"] == "worker_sigkill"]
        for k, at in enumerate(kill_times):
            nxt = kill_times[k + 1] if k + 1 < len(kill_times) else at + 60
            recoveries.append(
                {"event": "kill", "recovery_s": self.recovery_s(ends, at, nxt, clean_rate)}
            )
        for r in recoveries:
            key = f"recovery_le_10s:{r['event']}"
            ok = r["recovery_s"] is not None and r["recovery_s"] <= RECOVERY_TARGET_S
            targets[key] = targets.get(key, True) and ok
        return {
            "contender": self.name,
            "version": self.describe["version"],
            "job_table": self.job_table,
            "capacity_per_s": capacity and round(capacity, 1),
            "offered_per_s": round(rate, 1),
            "phases": phases,
            "recoveries": recoveries,
            "targets": targets,
            "events": self.events,
            "check": self.records.check(),
            "relations": [
                r["name"] + (" (index)" if r["kind"] == "i" else "") for r in self.relations
            ],
        }


# -- the command -----------------------------------------------------------------


def print_table(summaries: list[dict[str, Any]]) -> None:
    cols = [
        ("claim_p50_ms", "p50 ms"),
        ("claim_p95_ms", "p95 ms"),
        ("claim_p99_ms", "p99 ms"),
        ("throughput_per_s", "jobs/s"),
        ("job_table_dead_tuples_peak", "dead peak"),
        ("job_table_dead_tuples_median", "dead median"),
        ("total_size_growth_bytes", "size growth B"),
        ("xmin_age_max", "xmin age"),
    ]
    header = f"{'contender':<14} {'phase':<20} " + " ".join(f"{h:>13}" for _, h in cols)
    print(header)
    print("-" * len(header))
    for s in summaries:
        for phase, p in s["phases"].items():
            cells = " ".join(f"{'-' if p.get(k) is None else p[k]:>13}" for k, _ in cols)
            print(f"{s['contender']:<14} {phase:<20} {cells}")
    print()
    for s in summaries:
        print(
            f"{s['contender']}: capacity {s['capacity_per_s']} jobs/s, "
            f"offered {s['offered_per_s']} jobs/s"
        )
        print(f"  recoveries: {json.dumps(s['recoveries'])}")
        missed = [k for k, v in s["targets"].items() if not v]
        print(f"  targets missed: {missed or 'none'}")
        print(f"  check: {json.dumps(s['check'])}")
        exits = [e for e in s["events"] if e["event"] == "worker_exited_by_itself"]
        if exits:
            print(f"  workers that exited by themselves: {len(exits)} (see events)")
        errs = s.get("producer", {}).get("failed_calls")
        if errs:
            print(f"  producer: {errs} failed calls, retried")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sustained")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the sustained-load phases")
    run.add_argument("--contenders", default="pg_scheduler,pgqueuer,procrastinate")
    run.add_argument("--phase-seconds", type=float, default=180.0)
    run.add_argument("--phases", default=",".join(PHASES), help="comma-separated, in order")
    run.add_argument("--rate", type=float, help="offer this rate (jobs/s) to every contender")
    run.add_argument("--capacity-fraction", type=float, default=0.8)
    run.add_argument("--capacity-seconds", type=float, default=20.0)
    run.add_argument("--skip-capacity", action="store_true", help="with --rate: do not measure")
    run.add_argument(
        "--depth-target", type=float, help="keep the queue this deep instead of a rate"
    )
    run.add_argument("--sample-seconds", type=float, default=2.0)
    run.add_argument("--kill-every", type=float, default=15.0)
    run.add_argument(
        "--final-wait",
        type=float,
        default=90.0,
        help="after the phases: give up when no job ran for this long",
    )
    run.add_argument(
        "--options",
        default="{}",
        help='JSON: contender -> worker options, e.g. {"pg_scheduler": {"lease_duration": 3}}',
    )
    run.add_argument("--dsn", help="an existing server (default: embedded, in a temp dir)")
    run.add_argument("--pg-ctl-datadir", help="with --dsn: its data directory, for pg_ctl restart")
    run.add_argument("--out", help="output directory (default benchmarks/results/sustained-<time>)")
    run.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    args.phases = [p for p in args.phases.split(",") if p]
    for p in args.phases:
        if p not in PHASES:
            parser.error(f"unknown phase {p!r}; one of {PHASES}")
    return args


async def amain(args: argparse.Namespace, argv: list[str]) -> int:
    names = [n for n in args.contenders.split(",") if n]
    known = contender_names()
    for n in names:
        if n not in known:
            print(f"unknown contender {n!r}; one of {known}", file=sys.stderr)
            return 2
    out = Path(args.out) if args.out else RESULTS / f"sustained-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    server = await asyncio.to_thread(Postgres, args.dsn, args.pg_ctl_datadir)
    print(f"[server] {server.dsn}; results in {out}", flush=True)
    meta = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["python -m benchmarks.sustained", *argv]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "postgres": await asyncio.to_thread(server.describe),
        "commit": (
            await asyncio.to_thread(
                subprocess.run,
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                cwd=HERE,
            )
        ).stdout.strip(),
        "phase_seconds": args.phase_seconds,
        "sample_seconds": args.sample_seconds,
        "workers": WORKERS,
        "job": "await asyncio.sleep(0.001), 256-byte payload",
    }
    summaries = []
    for name in names:
        summaries.append(await Run(args, server, name, out).run())
        (out / "summary.json").write_text(
            json.dumps({"meta": meta, "contenders": summaries}, indent=2)
        )
    print()
    print_table(summaries)
    if not args.no_plots:
        plot_python = await asyncio.to_thread(venv_python, "plot", "matplotlib")
        await asyncio.to_thread(subprocess.run, [plot_python, str(PLOT), str(out)], check=False)
    print(f"\nresults: {out}")
    lost = sum(s["check"]["missing"] for s in summaries)
    return 0 if lost == 0 else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    return asyncio.run(amain(args, argv))
