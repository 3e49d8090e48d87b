"""Where a cross-process start's milliseconds go, beside the machine's floor.

``python benchmarks/xproc_breakdown.py [--dsn DSN] [--samples 200] [--gap-ms 20]``:
one embedded server (or ``--dsn``); this process is the producer, a child
process the worker; one sample every ``--gap-ms`` (as the latency scenarios).

1. The floor, no library: the producer sends one statement that inserts a
   row and sends a NOTIFY; the worker, on the notification, runs ``SELECT 1``
   on a second connection, or on the LISTEN connection itself. Time from the
   producer's send to the worker's answer.
2. This library: the producer calls ``schedule()`` of a due job (a Scheduler
   that runs no worker); the worker process runs
   ``Scheduler(max_concurrent_jobs=50, batch_claim_limit=50)``. Marks, each
   from the producer's call (``time.perf_counter()`` is one machine-wide
   clock on Linux): ``schedule()`` returned, the NOTIFY reached the worker's
   listener, the claim was sent, the claim was answered, the job's first line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    cache_logger_on_first_use=True,
)

import asyncpg  # noqa: E402
from checkouts import probe_arguments, server_dsn  # noqa: E402  (benchmarks/, next to this script)
from driver import spread_ms  # noqa: E402  (the latency scenarios' p50 and p99)

from pg_scheduler import Scheduler, task  # noqa: E402
from pg_scheduler.notify.listener import Listener  # noqa: E402
from pg_scheduler.store import Store  # noqa: E402

WARM_UP = 10
_starts: dict[int, float] = {}
_all_started: asyncio.Event | None = None
_expected = 0


@task(name="bench.xproc_breakdown")
async def probe_job(i: int) -> None:
    _starts[i] = time.perf_counter()
    if len(_starts) >= _expected and _all_started is not None:
        _all_started.set()


# -- worker process ----------------------------------------------------------------


async def _floor_worker(dsn: str, mode: str, total: int, ready: Path) -> dict[str, Any]:
    listen, second = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    answered: dict[int, float] = {}
    all_answered = asyncio.Event()
    conn = listen if mode == "listen" else second

    async def answer(i: int) -> None:
        await conn.fetchval("SELECT 1")
        answered[i] = time.perf_counter()
        if len(answered) >= total:
            all_answered.set()

    pending: set[asyncio.Task[None]] = set()

    def heard(_c: object, _pid: int, _channel: str, payload: str) -> None:
        job = asyncio.ensure_future(answer(int(payload)))
        pending.add(job)
        job.add_done_callback(pending.discard)

    await listen.add_listener("xproc_floor", heard)
    ready.touch()  # noqa: ASYNC240 (nothing else runs yet)
    await asyncio.wait_for(all_answered.wait(), 120)
    return {"answered": answered}


async def _library_worker(dsn: str, total: int, ready: Path) -> dict[str, Any]:
    global _all_started, _expected
    _all_started, _expected = asyncio.Event(), total
    notified: list[float] = []
    claims: list[tuple[float, float]] = []
    dispatch = Listener._dispatch
    claim = Store.claim

    def heard(self: Listener, conn: object, pid: int, channel: str, payload: str) -> None:
        if channel.startswith("pg_scheduler_jobs"):
            notified.append(time.perf_counter())
        dispatch(self, conn, pid, channel, payload)

    async def timed_claim(self: Store, *args: Any, **kwargs: Any) -> Any:
        sent = time.perf_counter()
        rows = await claim(self, *args, **kwargs)
        if rows:
            claims.append((sent, time.perf_counter()))
        return rows

    Listener._dispatch = heard  # type: ignore[method-assign]
    Store.claim = timed_claim  # type: ignore[method-assign]
    pool = await asyncpg.create_pool(dsn, min_size=4, max_size=10)
    scheduler = Scheduler(pool, max_concurrent_jobs=50, batch_claim_limit=50)
    await scheduler.start()
    await asyncio.sleep(3.0)  # past the start-up passes, as the latency scenarios wait
    ready.touch()  # noqa: ASYNC240 (one small file, once)
    await asyncio.wait_for(_all_started.wait(), 120)
    await scheduler.shutdown()
    await pool.close()
    return {"started": _starts, "notified": notified, "claims": claims}


# -- producer (this process) ----------------------------------------------------------


def _spawn(args: list[str], out: Path) -> subprocess.Popen[bytes]:
    for stale in (out, out.with_suffix(".ready")):
        stale.unlink(missing_ok=True)
    worker = subprocess.Popen([sys.executable, __file__, "--worker", *args, str(out)])
    deadline = time.monotonic() + 60
    while not out.with_suffix(".ready").exists():
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the worker process did not start")
        time.sleep(0.05)
    return worker


def _line(name: str, values: list[float]) -> str:
    spread = spread_ms(values)
    return f"  {name:44} p50 {spread['p50_ms']:6.2f}  p99 {spread['p99_ms']:6.2f} ms"


async def floor(dsn: str, mode: str, samples: int, gap: float, out: Path) -> list[str]:
    total = samples + WARM_UP
    worker = _spawn(["floor", dsn, mode, str(total)], out)
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE TABLE IF NOT EXISTS xproc_floor (i int)")
    sent: dict[int, float] = {}
    for i in range(total):
        await asyncio.sleep(gap)
        sent[i] = time.perf_counter()
        await conn.execute(
            f"WITH i AS (INSERT INTO xproc_floor VALUES ({i}))"
            f" SELECT pg_notify('xproc_floor', '{i}')"
        )
    await conn.close()
    await asyncio.to_thread(worker.wait, 60)
    answered = json.loads(await asyncio.to_thread(out.read_text))["answered"]
    delays = [(answered[str(i)] - sent[i]) * 1000 for i in range(WARM_UP, total)]
    where = "the LISTEN connection" if mode == "listen" else "a second connection"
    return [_line(f"NOTIFY -> SELECT 1 on {where}", delays)]


async def library(dsn: str, samples: int, gap: float, out: Path) -> list[str]:
    total = samples + WARM_UP
    worker = _spawn(["library", dsn, "-", str(total)], out)
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
    producer = Scheduler(pool)
    called: dict[int, tuple[float, float]] = {}
    for i in range(total):
        await asyncio.sleep(gap)
        t = time.perf_counter()
        await producer.schedule(probe_job, execution_time=datetime.now(UTC), args=(i,))
        called[i] = (t, time.perf_counter())
    await asyncio.to_thread(worker.wait, 60)
    await pool.close()
    marks = json.loads(await asyncio.to_thread(out.read_text))
    notified, claims = sorted(marks["notified"]), sorted(marks["claims"])
    rows: list[tuple[float, ...]] = []
    for i in range(WARM_UP, total):
        t, returned = called[i]
        heard = min(x for x in notified if x >= t)
        sent, answered = min(c for c in claims if c[0] >= t)
        started = marks["started"][str(i)]
        rows.append((returned - t, heard - t, sent - t, answered - t, started - t))
    names = (
        "schedule() returned",
        "NOTIFY at the worker's listener",
        "claim sent",
        "claim answered",
        "job's first line",
    )
    return [_line(name, [r[k] * 1000 for r in rows]) for k, name in enumerate(names)]


async def main(dsn: str, samples: int, gap: float) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    await Scheduler(pool).initialize_db()
    await pool.close()
    with tempfile.TemporaryDirectory(prefix="xproc-") as tmp:
        out = Path(tmp) / "marks.json"
        print(f"floor, no library ({samples} samples, {gap * 1000:.0f} ms apart):")
        for mode in ("second", "listen"):
            for line in await floor(dsn, mode, samples, gap, out):
                print(line, flush=True)
        print("this library, each mark from the producer's schedule() call:")
        for line in await library(dsn, samples, gap, out):
            print(line, flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        role, dsn, mode, total, out = sys.argv[2:7]
        ready = Path(out).with_suffix(".ready")
        if role == "floor":
            marks = asyncio.run(_floor_worker(dsn, mode, int(total), ready))
        else:
            marks = asyncio.run(_library_worker(dsn, int(total), ready))
        Path(out).write_text(json.dumps(marks))
        sys.exit(0)
    args = probe_arguments(__doc__)
    asyncio.run(main(server_dsn(args.dsn, "xproc-"), args.samples, args.gap_ms / 1000))
