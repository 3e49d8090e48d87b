"""Runs one scenario for one contender, inside that contender's virtualenv.

Usage (the orchestrator calls this): ``python driver.py CONTENDER SCENARIO JSON``.
It prints one line ``RESULT {...}`` with the measurements and the correctness
checks. Only the standard library and asyncpg are needed here (uvloop with
``PGS_BENCH_UVLOOP=1``); the contender module (``contenders/c_<name>.py``) imports its own library.

Every job is the same no-op ``async def job(i)``: it records that job ``i``
ran (and when), so the driver can check that each due job ran exactly once
and no future-dated job ran at all.
"""

from __future__ import annotations

import array
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import queue_scenarios  # benchmarks/, next to this script
from server_cpu import cpu_seconds, server_pids

HERE = Path(__file__).resolve().parent
FUTURE_BASE = 10_000_000  # ids of future-dated jobs start here
CROSS_BASE = 20_000_000  # ids of jobs a producer process schedules (latency from outside)


class Record:
    """What the jobs did, process-local and cheap (a counter per id)."""

    def __init__(self) -> None:
        self.counts = array.array("I")
        self.future_ran = 0
        self.done = 0
        self.target = 0
        self.all_done: asyncio.Event | None = None
        self.started: dict[int, float] = {}
        self.waiters: dict[int, asyncio.Future[float]] = {}
        self.last_end = 0.0
        # Jobs scheduled by another process: sample -> start time (perf_counter,
        # CLOCK_MONOTONIC: comparable across processes on one Linux machine).
        self.cross_started: dict[int, float] = {}
        # ... and how many of this run's own jobs were still to run then.
        self.cross_backlog: dict[int, int] = {}
        self.cross_target = 0
        self.cross_done = asyncio.Event()
        # Set once ``milestone`` jobs have run (the critical scenario starts sampling).
        self.milestone = 0
        self.reached = asyncio.Event()

    def reset(self, n: int) -> None:
        self.counts = array.array("I", bytes(4 * n))
        self.future_ran = 0
        self.done = 0
        self.target = n
        self.all_done = asyncio.Event()
        self.started.clear()
        self.waiters.clear()
        self.cross_started.clear()
        self.cross_backlog.clear()
        self.cross_target = self.milestone = 0
        self.cross_done = asyncio.Event()
        self.reached = asyncio.Event()

    def ran(self, i: int) -> None:
        now = time.perf_counter()
        if i >= CROSS_BASE:
            self.cross_started.setdefault(i - CROSS_BASE, now)
            self.cross_backlog.setdefault(i - CROSS_BASE, self.target - self.done)
            if self.cross_target and len(self.cross_started) >= self.cross_target:
                self.cross_done.set()
            return
        if i >= FUTURE_BASE:
            self.future_ran += 1
            return
        waiter = self.waiters.pop(i, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(now)
        if i < len(self.counts):
            self.counts[i] += 1
        self.done += 1
        if self.done == self.milestone:
            self.reached.set()
        self.last_end = time.time()
        if self.done >= self.target and self.all_done is not None:
            self.all_done.set()

    def verify(self, n: int) -> dict[str, Any]:
        missing = sum(1 for c in self.counts[:n] if c == 0)
        duplicated = sum(1 for c in self.counts[:n] if c > 1)
        return {
            "missing": missing,
            "duplicated": duplicated,
            "future_ran_early": self.future_ran,
            "ok": missing == 0 and duplicated == 0 and self.future_ran == 0,
        }


RECORD = Record()


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class RssSampler:
    def __init__(self) -> None:
        self.peak = 0.0
        self.start = rss_mb()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_mb())
            await asyncio.sleep(0.05)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.peak = max(self.peak, rss_mb())


def load_contender(name: str) -> Any:
    sys.path.insert(0, str(HERE / "contenders"))  # variants import their base module
    path = HERE / "contenders" / f"c_{name}.py"
    spec = importlib.util.spec_from_file_location(f"c_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def spread_ms(values: list[float]) -> dict[str, float | None]:
    """p50, p90, p99 and max of samples in ms (None each when there are none)."""
    if not values:
        return dict.fromkeys(("p50_ms", "p90_ms", "p99_ms", "max_ms"))
    return {
        "p50_ms": round(statistics.median(values), 3),
        "p90_ms": round(pct(values, 0.90), 3),
        "p99_ms": round(pct(values, 0.99), 3),
        "max_ms": round(max(values), 3),
    }


async def settle(dsn: str) -> None:
    """After a large load: vacuum, analyze and checkpoint now, so the timed drain
    does not share the machine with the autovacuum and checkpoint the load
    triggered. The same for every contender."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM ANALYZE")
        await conn.execute("CHECKPOINT")
    except asyncpg.PostgresError:
        pass  # not a superuser (--dsn): skip the checkpoint
    finally:
        await conn.close()


def start_profiler(cfg: dict[str, Any]) -> Any:
    """With ``"profile": PATH`` in the config, profile the timed phase (pyinstrument)."""
    if not cfg.get("profile"):
        return None
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005, async_mode="disabled")
    profiler.start()
    return profiler


def stop_profiler(profiler: Any, cfg: dict[str, Any]) -> None:
    if profiler is None:
        return
    profiler.stop()
    Path(cfg["profile"]).write_text(profiler.output_text(unicode=False, show_all=False))


async def wait_all_done(timeout: float) -> bool:
    assert RECORD.all_done is not None
    try:
        await asyncio.wait_for(RECORD.all_done.wait(), timeout)
        return True
    except TimeoutError:
        return False


# -- scenarios -------------------------------------------------------------------


async def _server_pids(dsn: str) -> list[int]:
    """The PostgreSQL server's processes, when it runs on this machine (else [])."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        own = conn.get_server_pid()  # exits next: leave it out
        return [p for p in server_pids(own) if p != own]
    finally:
        await conn.close()


async def drain(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Enqueue N due jobs with no worker running, then time one worker draining them."""
    n = cfg["n"]
    RECORD.reset(n)
    t = time.perf_counter()
    await c.enqueue_due(range(n))
    enqueue_s = time.perf_counter() - t
    await settle(cfg["dsn"])
    pids = await _server_pids(cfg["dsn"])
    profiler = start_profiler(cfg)
    with RssSampler() as rss:
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        server0 = cpu_seconds(pids)
        await c.start_worker(cfg["concurrency"])
        finished = await wait_all_done(cfg["timeout"])
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        # Backends the worker opened meanwhile count from zero; they are still open.
        server = cpu_seconds(pids + [p for p in await _server_pids(cfg["dsn"]) if p not in pids])
    stop_profiler(profiler, cfg)
    await c.stop_worker()
    await asyncio.sleep(cfg.get("settle", 0.3))
    return {
        "jobs": n,
        "seconds": round(elapsed, 4),
        "jobs_per_s": round(RECORD.done / elapsed, 1),
        "finished": finished,
        "bulk_enqueue_per_s": round(n / enqueue_s, 1),
        # Worker-process CPU per job: less sensitive to a busy machine than jobs/s.
        "python_cpu_us_per_job": round(cpu / max(1, RECORD.done) * 1e6, 1),
        # Every process of the server (backends, WAL writer, checkpointer...);
        # None when the server is not on this machine.
        "server_cpu_us_per_job": (
            round((server - server0) / max(1, RECORD.done) * 1e6, 1) if pids else None
        ),
        "rss_start_mb": round(rss.start, 1),
        "rss_peak_mb": round(rss.peak, 1),
        "check": RECORD.verify(n),
    }


async def backlog(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """N due jobs behind F future-dated ones (due in an hour): time the due drain."""
    n, future = cfg["n"], cfg["future"]
    RECORD.reset(n)
    t = time.perf_counter()
    chunk = 50_000
    for start in range(0, future, chunk):
        await c.enqueue_future(range(FUTURE_BASE + start, FUTURE_BASE + min(future, start + chunk)))
    future_s = time.perf_counter() - t
    await c.enqueue_due(range(n))
    await c.analyze()
    await settle(cfg["dsn"])
    with RssSampler() as rss:
        t0 = time.perf_counter()
        await c.start_worker(cfg["concurrency"])
        finished = await wait_all_done(cfg["timeout"])
        elapsed = time.perf_counter() - t0
        # Keep the worker up a little longer: a future job that runs early shows up here.
        await asyncio.sleep(cfg.get("linger", 1.0))
    await c.stop_worker()
    return {
        "jobs": n,
        "future": future,
        "seconds": round(elapsed, 4),
        "jobs_per_s": round(RECORD.done / elapsed, 1),
        "finished": finished,
        "future_enqueue_per_s": round(future / future_s, 1) if future else None,
        "rss_peak_mb": round(rss.peak, 1),
        "check": RECORD.verify(n),
    }


async def latency(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Idle worker; enqueue one job at a time and measure enqueue-call-to-start."""
    samples, warmup = cfg["samples"], cfg.get("warmup", 20)
    total = samples + warmup
    RECORD.reset(total)
    await c.start_worker(cfg["concurrency"])
    # Idle means steady state: past every startup pass (first vacuum, rescue, ...).
    await asyncio.sleep(cfg.get("idle_before", 3.0))
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    slow: list[tuple[float, float]] = []  # (seconds into the run, ms) of samples > 20 ms
    begin = time.perf_counter()
    lost = 0
    for i in range(total):
        waiter: asyncio.Future[float] = loop.create_future()
        RECORD.waiters[i] = waiter
        t = time.perf_counter()
        await c.enqueue_one(i)
        try:
            started = await asyncio.wait_for(waiter, cfg.get("sample_timeout", 5.0))
        except TimeoutError:
            lost += 1
            continue
        if i >= warmup:
            lat.append((started - t) * 1000)
            if lat[-1] > 20:
                slow.append((round(t - begin, 2), round(lat[-1], 1)))
        # Let the worker go idle again (its acks written, back to waiting).
        await asyncio.sleep(cfg.get("gap", 0.02))
    await wait_all_done(5.0)
    await c.stop_worker()
    await asyncio.sleep(0.2)
    return {
        "samples": len(lat),
        **spread_ms(lat),
        "timeouts": lost,
        "slow_samples": slow[:20],
        "check": RECORD.verify(total),
    }


async def startup(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Schema current, one due job waiting, the worker built but not started:
    time from start to the job running (and to start returning), ``samples``
    times in this process (each with a fresh worker object; the pool, and so
    its server connections, is the one setup() made: the first sample is the
    cold one)."""
    samples = cfg.get("samples", 5)
    loop = asyncio.get_running_loop()
    first_job: list[float] = []
    returned: list[float] = []
    for _ in range(samples):
        RECORD.reset(1)
        await c.enqueue_due(range(1))
        waiter: asyncio.Future[float] = loop.create_future()
        RECORD.waiters[0] = waiter
        await c.prepare_worker(cfg["concurrency"])
        t = time.perf_counter()
        await c.start_worker(cfg["concurrency"])
        returned.append((time.perf_counter() - t) * 1000)
        ran = await asyncio.wait_for(waiter, cfg.get("timeout", 30))
        first_job.append((ran - t) * 1000)
        await c.stop_worker()
    return {
        "samples": samples,
        "first_job_ms": [round(x, 1) for x in first_job],
        "first_job_p50_ms": round(statistics.median(first_job), 2),
        "cold_first_job_ms": round(first_job[0], 2),
        "start_returned_p50_ms": round(statistics.median(returned), 2),
        "check": {"ok": RECORD.done == 1},
    }


async def enqueue(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Bulk enqueue rate (future-dated, no worker) and single-call enqueue latency."""
    n, singles = cfg["n"], cfg["singles"]
    t = time.perf_counter()
    await c.enqueue_future(range(FUTURE_BASE, FUTURE_BASE + n))
    bulk_s = time.perf_counter() - t
    lat = []
    for i in range(singles):
        t = time.perf_counter()
        await c.enqueue_one(FUTURE_BASE + n + i, future=True)
        lat.append((time.perf_counter() - t) * 1000)
    lat = lat[10:] if len(lat) > 20 else lat
    count = await c.count_jobs()
    ok = count == n + singles if count is not None else None
    return {
        "bulk_jobs": n,
        "bulk_per_s": round(n / bulk_s, 1),
        "single_p50_ms": round(statistics.median(lat), 3),
        "single_p99_ms": round(pct(lat, 0.99), 3),
        "check": {"rows": count, "ok": ok},
    }


async def scale_worker(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """One of K worker processes: wait for 'go' on stdin, drain until the queue is empty."""
    RECORD.reset(cfg["n"])
    await c.prepare_worker(cfg["concurrency"])
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    go = time.time()
    await c.start_worker(cfg["concurrency"])
    # The queue is shared with the other processes: poll the database for empty.
    while await c.remaining() > 0:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    await c.stop_worker()
    return {
        "go": go,
        "last_end": RECORD.last_end,
        "ran": RECORD.done,
        "counts": [i for i, v in enumerate(RECORD.counts) if v],
        "dups": sum(1 for v in RECORD.counts if v > 1),
    }


async def scale_enqueue(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    await c.enqueue_due(range(cfg["n"]))
    await c.analyze()
    return {"enqueued": cfg["n"]}


async def foreign(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    return await queue_scenarios.foreign(c, {**cfg, "settle": settle}, RECORD, wait_all_done)


async def idle_cpu(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    return await queue_scenarios.idle_cpu(c, {**cfg, "settle": settle}, RECORD)


async def producer(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """The other process of the cross-process scenarios: on "go" (stdin),
    schedules ``samples`` jobs ``gap`` seconds apart (``priority``: "critical"
    or "normal"), each through the library's own schedule() call, and reports
    when each call began."""
    print("READY", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    sent: list[float] = []
    for i in range(cfg["samples"]):
        sent.append(time.perf_counter())
        await c.enqueue_from_outside(CROSS_BASE + i, cfg.get("priority", "normal"))
        await asyncio.sleep(cfg.get("gap", 0.05))
    return {"sent": sent}


class Outside:
    """The producer process of the cross-process scenarios, started ahead (its
    interpreter and pool are ready before sampling begins)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.proc: asyncio.subprocess.Process | None = None

    async def ready(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(__file__)),
            self.cfg["contender"],
            "producer",
            json.dumps(self.cfg),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        while (await self.proc.stdout.readline()).strip() != b"READY":
            pass

    async def run(self) -> list[float | None]:
        """Let it schedule its jobs; the call-to-start delay of each (ms; None: never ran)."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()
        out, _ = await self.proc.communicate()
        line = next(x for x in out.decode().splitlines() if x.startswith("RESULT "))
        sent: list[float] = json.loads(line[7:])["sent"]
        RECORD.cross_target = len(sent)
        if len(RECORD.cross_started) < len(sent):
            try:
                await asyncio.wait_for(RECORD.cross_done.wait(), 10)
            except TimeoutError:
                pass
        return [
            (RECORD.cross_started[i] - t) * 1000 if i in RECORD.cross_started else None
            for i, t in enumerate(sent)
        ]


def _summary(delays: list[float | None]) -> dict[str, Any]:
    got = [d for d in delays if d is not None]
    return {
        "samples": len(got),
        "lost": len(delays) - len(got),
        **spread_ms(got),
    }


async def latency_cross(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Idle worker; another process schedules one job at a time: call-to-start."""
    RECORD.reset(0)
    outside = Outside({**cfg, "priority": "normal", "gap": 0.02})
    await outside.ready()
    await c.start_worker(cfg["concurrency"])
    await asyncio.sleep(cfg.get("idle_before", 3.0))  # steady state, as in latency
    delays = await outside.run()
    await c.stop_worker()
    out = _summary(delays)
    out["check"] = {"ok": out["lost"] == 0}
    return out


async def critical(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """A worker drains ``n`` due normal jobs; meanwhile another process
    schedules CRITICAL jobs ``gap`` apart: how long each waits to start."""
    n = cfg["n"]
    RECORD.reset(n)
    await c.enqueue_due(range(n))
    await settle(cfg["dsn"])
    outside = Outside({**cfg, "priority": "critical"})
    await outside.ready()
    # Sample only while the backlog is being drained (past the worker's start).
    RECORD.milestone = min(n // 20, 2000)
    await c.start_worker(cfg["concurrency"])
    await RECORD.reached.wait()
    delays = await outside.run()
    backlog_left = n - RECORD.done
    await wait_all_done(cfg.get("timeout", 600))
    await c.stop_worker()
    out = _summary(delays)
    out["backlog_left_after_last_sample"] = backlog_left
    # A sample counts only if it started while the backlog still had jobs to run.
    out["samples_after_backlog"] = sum(1 for left in RECORD.cross_backlog.values() if left <= 0)
    check = RECORD.verify(n)
    check["ok"] = (
        check["ok"] and out["lost"] == 0 and backlog_left > 0 and not out["samples_after_backlog"]
    )
    out["check"] = check
    return out


SCENARIOS = {
    "producer": producer,
    "latency_cross": latency_cross,
    "critical": critical,
    "foreign": foreign,
    "idle_cpu": idle_cpu,
    "drain": drain,
    "backlog": backlog,
    "latency": latency,
    "enqueue": enqueue,
    "startup": startup,
    "scale_worker": scale_worker,
    "scale_enqueue": scale_enqueue,
}


async def main() -> None:
    name, scenario, raw = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = json.loads(raw)
    cfg["contender"] = name
    module = load_contender(name)
    contender = module.Contender(cfg["dsn"], RECORD)
    await contender.setup()
    try:
        result = await SCENARIOS[scenario](contender, cfg)
        result["version"] = contender.version
    finally:
        await contender.close()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    # A plain asyncio loop, as the applications (and the outside harness)
    # run; PGS_BENCH_UVLOOP=1 (``--uvloop``) runs every contender on uvloop.
    if os.environ.get("PGS_BENCH_UVLOOP"):
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
