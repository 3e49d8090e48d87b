"""Runs one workflow scenario for one contender, inside that contender's interpreter.

Usage (``__main__.py`` calls this): ``python driver.py CONTENDER SCENARIO JSON``.
It prints one line ``RESULT {...}``: the measurements, the settings used and a
``check`` whose ``ok`` is the verdict on correctness (every workflow ran to
completion exactly once with the right result, every step body ran once).
Only the standard library and asyncpg are needed here; the contender module
(``c_<name>.py`` beside this file) imports its own library.

Times are ``time.perf_counter()`` in this one process (the workflows and the
harness share it), so step gaps and resume delays need no clock agreement.
"""

from __future__ import annotations

import array
import asyncio
import importlib.util
import itertools
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: server_cpu

from server_cpu import cpu_seconds, server_pids  # noqa: E402


class Record:
    """What the workflow bodies did, written from any thread the library runs
    them on (DBOS runs dequeued async workflows on its own event loop thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread = 0
        self.reset(0)

    def reset(self, n: int, expected: Callable[[int], Any] | None = None) -> None:
        self.n = n
        self.expected = expected
        self.finished = array.array("I", bytes(4 * n))
        self.wrong: list[tuple[int, Any]] = []
        self.done = 0
        self.all_done = asyncio.Event()
        self.first_enter: float | None = None
        self.last_end = 0.0
        self.inside = 0
        self.inside_max = 0
        self.enters = 0
        self.steps: list[tuple[int, int, float]] = []
        self.waiting_ids: set[int] = set()
        self.park_target = 0
        self.all_waiting = asyncio.Event()
        self.children = array.array("I")
        self.child_last_end = 0.0
        self.parent_enters = 0
        self.parent_resumed: float | None = None

    def _set(self, event: asyncio.Event) -> None:
        if threading.get_ident() == self.loop_thread:
            event.set()
        else:
            assert self.loop is not None
            self.loop.call_soon_threadsafe(event.set)

    # -- called by the workflow bodies ------------------------------------------------

    def enter(self, i: int) -> None:
        """First line of a workflow body (each run of it, replays included)."""
        now = time.perf_counter()
        with self._lock:
            self.enters += 1
            self.inside += 1
            self.inside_max = max(self.inside_max, self.inside)
            if self.first_enter is None:
                self.first_enter = now

    def leave(self, i: int) -> None:
        """A workflow body returned, raised or was unwound (``finally``)."""
        with self._lock:
            self.inside -= 1

    def step(self, i: int, k: int) -> None:
        """First line of step ``k`` of workflow ``i``."""
        now = time.perf_counter()
        with self._lock:
            self.steps.append((i, k, now))

    def finish(self, i: int, value: Any) -> None:
        """Last line of workflow ``i``'s body, with what it will return."""
        now = time.perf_counter()
        with self._lock:
            if 0 <= i < len(self.finished):
                self.finished[i] += 1
            if self.expected is not None and value != self.expected(i):
                self.wrong.append((i, value))
            self.done += 1
            self.last_end = max(self.last_end, now)
            reached = self.done == self.n
        if reached:
            self._set(self.all_done)

    def waiting(self, i: int) -> None:
        """Workflow ``i`` is about to wait for its signal."""
        with self._lock:
            self.waiting_ids.add(i)
            reached = len(self.waiting_ids) == self.park_target
        if reached:
            self._set(self.all_waiting)

    def child(self, i: int) -> None:
        """Last line of child ``i``'s body."""
        now = time.perf_counter()
        with self._lock:
            if 0 <= i < len(self.children):
                self.children[i] += 1
            self.child_last_end = max(self.child_last_end, now)

    def parent_enter(self) -> None:
        with self._lock:
            self.parent_enters += 1

    def resumed(self) -> None:
        """The parent's first line after its gather returned."""
        self.parent_resumed = time.perf_counter()

    # -- checks -----------------------------------------------------------------------

    def verify(self) -> dict[str, Any]:
        missing = sum(1 for c in self.finished if c == 0)
        duplicated = sum(1 for c in self.finished if c > 1)
        return {
            "missing": missing,
            "finished_twice": duplicated,
            "wrong_results": len(self.wrong),
            "wrong_examples": self.wrong[:5],
            "ok": missing == 0 and duplicated == 0 and not self.wrong,
        }

    def verify_steps(self, n: int, steps: int) -> dict[str, Any]:
        runs = Counter((i, k) for i, k, _ in self.steps)
        missing = sum(1 for i in range(n) for k in range(steps) if (i, k) not in runs)
        twice = sum(1 for c in runs.values() if c > 1)
        return {"step_missing": missing, "step_ran_twice": twice}


RECORD = Record()


def load_contender(name: str) -> Any:
    path = HERE / f"c_{name}.py"
    spec = importlib.util.spec_from_file_location(f"c_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def spread_ms(values: list[float]) -> dict[str, float | None]:
    """p50, p90, p99 and max of samples given in seconds, as ms."""
    if not values:
        return dict.fromkeys(("p50_ms", "p90_ms", "p99_ms", "max_ms"))
    ms = [v * 1000 for v in values]
    return {
        "p50_ms": round(statistics.median(ms), 3),
        "p90_ms": round(pct(ms, 0.90), 3),
        "p99_ms": round(pct(ms, 0.99), 3),
        "max_ms": round(max(ms), 3),
    }


async def settle(dsn: str) -> None:
    """After a load: vacuum, analyze and checkpoint now, the same for every
    contender, so the timed phase does not share the machine with them."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM ANALYZE")
        await conn.execute("CHECKPOINT")
    except asyncpg.PostgresError:
        pass  # not a superuser (--dsn): skip the checkpoint
    finally:
        await conn.close()


class Monitor:
    """A connection of the harness's own: the server's processes and backends."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        own = conn.get_server_pid()
        self.pids = server_pids(own)

    @classmethod
    async def open(cls, dsn: str) -> Monitor:
        return cls(await asyncpg.connect(dsn))

    def all_pids(self) -> list[int]:
        """The server's processes now (backends opened since count from zero)."""
        fresh = server_pids(self.conn.get_server_pid())
        return self.pids + [p for p in fresh if p not in self.pids]

    async def backends(self) -> dict[str, int]:
        """This database's other backends: all of them, and those not idle
        (running a statement, or inside a transaction)."""
        row = await self.conn.fetchrow(
            """
            SELECT count(*) AS total,
                   count(*) FILTER (WHERE state IS NOT NULL AND state <> 'idle') AS busy
              FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
            """
        )
        return {"total": row["total"], "busy": row["busy"]}

    async def close(self) -> None:
        await self.conn.close()


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), timeout)
        return True
    except TimeoutError:
        return False


def step_value(i: int, steps: int) -> int:
    """What a workflow of ``steps`` no-op steps returns (step k returns i + k)."""
    return steps * i + steps * (steps - 1) // 2


# -- scenarios -----------------------------------------------------------------------


async def step_overhead(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """One ``steps``-step no-op workflow at a time, ``n`` times (after ``warmup``),
    started and awaited in this process with the worker running here.

    A sample is the time from the first line of step k's body to the first line
    of step k+1's body, in one workflow run: step k's (empty) body, the writing
    of its checkpoint, and whatever the library does before the next body runs.
    ``steps - 1`` samples per workflow."""
    n, steps, warmup = cfg["n"], cfg["steps"], cfg.get("warmup", 10)
    total = n + warmup
    RECORD.reset(total, lambda i: step_value(i, steps))
    await c.start_worker(cfg["concurrency"], queue=False)
    await asyncio.sleep(cfg.get("idle_before", 1.0))  # past the worker's start-up passes
    calls: list[float] = []
    returned_wrong = 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for i in range(total):
        t = time.perf_counter()
        value = await asyncio.wait_for(c.run_one(i, steps), cfg.get("timeout", 60))
        if i >= warmup:
            calls.append(time.perf_counter() - t)
        returned_wrong += value != step_value(i, steps)
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    await c.stop_worker()
    by_run: dict[int, list[tuple[int, float]]] = {}
    for i, k, at in RECORD.steps:
        by_run.setdefault(i, []).append((k, at))
    gaps: list[float] = []
    for i, marks in by_run.items():
        if i < warmup:
            continue
        marks.sort()
        gaps += [b[1] - a[1] for a, b in itertools.pairwise(marks)]
    check = {**RECORD.verify(), **RECORD.verify_steps(total, steps)}
    check["returned_wrong"] = returned_wrong
    clean = not (check["step_missing"] or check["step_ran_twice"] or returned_wrong)
    check["ok"] = check["ok"] and clean
    return {
        "workflows": n,
        "steps": steps,
        "samples": len(gaps),
        "step_gap": spread_ms(gaps),
        # From the start call to the result in hand (schedule/start + result).
        "workflow_call": spread_ms(calls),
        "worker_cpu_us_per_step": round(cpu / (total * steps) * 1e6, 1),
        "seconds": round(elapsed, 3),
        "check": check,
    }


async def _timed_drain(c: Any, cfg: dict[str, Any], kind: str) -> dict[str, Any]:
    """Enqueue with no worker consuming, then time the worker draining them."""
    n, steps = cfg["n"], cfg.get("steps", 0)
    RECORD.reset(n, (lambda i: step_value(i, steps)) if kind == "steps" else (lambda i: i))
    t = time.perf_counter()
    if kind == "steps":
        await c.enqueue_workflows(range(n), steps)
    else:
        await c.enqueue_plain(range(n))
    enqueue_s = time.perf_counter() - t
    await settle(cfg["dsn"])
    monitor = await Monitor.open(cfg["dsn"])
    server0 = cpu_seconds(monitor.pids)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    await c.start_worker(cfg["concurrency"], queue=True)
    finished = await wait_event(RECORD.all_done, cfg.get("timeout", 600))
    end = RECORD.last_end if finished else time.perf_counter()
    cpu = time.process_time() - cpu0
    server = cpu_seconds(monitor.all_pids()) - server0
    await asyncio.sleep(cfg.get("linger", 0.5))  # a body that runs twice shows up here
    completed = await c.completed_count()
    await c.stop_worker()
    await monitor.close()
    first = RECORD.first_enter or t0
    check = RECORD.verify()
    if kind == "steps":
        check.update(RECORD.verify_steps(n, steps))
        check["ok"] = check["ok"] and not check["step_missing"] and not check["step_ran_twice"]
    check["completed_in_db"] = completed
    check["ok"] = check["ok"] and finished and completed == n
    seconds = end - first
    out: dict[str, Any] = {
        "n": n,
        "steps": steps,
        "finished": finished,
        # From the first body's first line to the last body's last line.
        "seconds": round(seconds, 4),
        # From the worker's start (pg_scheduler) or the queue's registration (DBOS).
        "seconds_from_start": round(end - t0, 4),
        "per_s": round(RECORD.done / seconds, 1) if seconds > 0 else None,
        "enqueue_s": round(enqueue_s, 3),
        "worker_cpu_us_per_item": round(cpu / max(1, RECORD.done) * 1e6, 1),
        "server_cpu_us_per_item": (
            round(server / max(1, RECORD.done) * 1e6, 1) if monitor.pids else None
        ),
        "check": check,
    }
    if kind == "steps":
        out["steps_per_s"] = round(RECORD.done * steps / seconds, 1) if seconds > 0 else None
    return out


async def throughput(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """``n`` workflows of ``steps`` no-op steps enqueued at once, then drained."""
    return await _timed_drain(c, cfg, "steps")


async def plain(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """The baseline: ``n`` no-op plain jobs (DBOS: workflows without steps)."""
    return await _timed_drain(c, cfg, "plain")


async def parked(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """``n`` workflows waiting for a signal: what they hold while they wait, the
    server's CPU meanwhile, then the drain once every one is signalled."""
    n = cfg["n"]
    RECORD.reset(n, lambda i: i)
    RECORD.park_target = n
    await c.start_worker(cfg["concurrency"], queue=False)
    # What the idle worker holds by itself (its LISTEN connection and the like):
    # parked workflows should add nothing to it.
    await asyncio.sleep(cfg.get("quiet_before", 2.0))
    pool_idle = c.pool_in_use()
    t0 = time.perf_counter()
    await c.start_parked(range(n))
    start_calls_s = time.perf_counter() - t0
    # A library that kept its slots while waiting would never get them all waiting.
    waiting = await wait_event(RECORD.all_waiting, cfg.get("park_timeout", 300))
    settled = waiting and await c.wait_parked(n, cfg.get("park_timeout", 300))
    park_s = time.perf_counter() - t0
    await settle(cfg["dsn"])
    await asyncio.sleep(cfg.get("quiet_before", 2.0))
    monitor = await Monitor.open(cfg["dsn"])
    samples: list[dict[str, Any]] = []
    server0 = cpu_seconds(monitor.pids)
    cpu0 = time.process_time()
    w0 = time.perf_counter()
    deadline = w0 + cfg["idle_seconds"]
    while True:
        backends = await monitor.backends()
        samples.append(
            {
                "running_rows": await c.running_rows(),
                "bodies_in_memory": RECORD.inside,
                "pool_in_use": c.pool_in_use(),
                "server_busy": backends["busy"],
                "server_backends": backends["total"],
            }
        )
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        await asyncio.sleep(min(cfg.get("sample_every", 1.0), left))
    window = time.perf_counter() - w0
    server_cpu = cpu_seconds(monitor.all_pids()) - server0
    worker_cpu = time.process_time() - cpu0
    await monitor.close()

    def peak(key: str) -> Any:
        values = [s[key] for s in samples if s[key] is not None]
        return max(values) if values else None

    t_signal = time.perf_counter()
    await c.signal_all(range(n))
    send_s = time.perf_counter() - t_signal
    finished = await wait_event(RECORD.all_done, cfg.get("timeout", 600))
    end = RECORD.last_end if finished else time.perf_counter()
    await asyncio.sleep(cfg.get("linger", 0.5))
    completed = await c.completed_count()
    await c.stop_worker()
    check = RECORD.verify()
    check["all_waited"] = waiting and settled
    check["completed_in_db"] = completed
    check["ok"] = check["ok"] and finished and check["all_waited"] and completed == n
    drain_s = end - t_signal
    return {
        "n": n,
        "start_calls_s": round(start_calls_s, 3),
        # From the first start call until every workflow waits (and, for a
        # library that parks, none is left running).
        "park_s": round(park_s, 3),
        "idle_window_s": round(window, 2),
        "samples": len(samples),
        # Peaks over the window's samples (one a second).
        "running_rows_max": peak("running_rows"),
        "bodies_in_memory_max": peak("bodies_in_memory"),
        "pool_in_use_max": peak("pool_in_use"),
        "pool_in_use_idle_worker": pool_idle,
        "pool_in_use_for_parked": (
            peak("pool_in_use") - pool_idle
            if peak("pool_in_use") is not None and pool_idle is not None
            else None
        ),
        "server_busy_backends_max": peak("server_busy"),
        "server_backends": peak("server_backends"),
        "server_cpu_pct_of_core": round(server_cpu / window * 100, 2) if monitor.pids else None,
        "worker_cpu_pct_of_core": round(worker_cpu / window * 100, 2),
        "signal_send_s": round(send_s, 3),
        # From the first signal call to the last workflow's last line.
        "drain_s": round(drain_s, 4),
        "drain_per_s": round(RECORD.done / drain_s, 1) if drain_s > 0 else None,
        "finished": finished,
        "check": check,
    }


async def fanout(c: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """One parent spawns ``n`` children and gathers their results."""
    n = cfg["n"]
    expected = n * (n - 1) // 2
    RECORD.reset(1, lambda _: expected)
    RECORD.children = array.array("I", bytes(4 * n))
    await c.start_worker(cfg["concurrency"], queue=True)
    await asyncio.sleep(cfg.get("idle_before", 1.5))  # the queue's worker is up
    t0 = time.perf_counter()
    handle = await c.start_fanout(n)
    try:
        value = await asyncio.wait_for(c.fanout_result(handle), cfg.get("timeout", 900))
        error = None
    except Exception as exc:  # a clear line in the result, not a traceback
        value, error = None, f"{type(exc).__name__}: {exc}"[:500]
    e2e = time.perf_counter() - t0
    await asyncio.sleep(cfg.get("linger", 0.5))
    await c.stop_worker()
    child_missing = sum(1 for x in RECORD.children if x == 0)
    child_twice = sum(1 for x in RECORD.children if x > 1)
    check = RECORD.verify()
    check.update(
        {
            "result_ok": value == expected,
            "child_missing": child_missing,
            "child_ran_twice": child_twice,
            "error": error,
        }
    )
    check["ok"] = check["ok"] and value == expected and not child_missing and not child_twice
    resume = (
        (RECORD.parent_resumed - RECORD.child_last_end)
        if RECORD.parent_resumed and RECORD.child_last_end
        else None
    )
    return {
        "n": n,
        # From the parent's start call to its result in hand.
        "e2e_s": round(e2e, 4),
        "children_per_s": round(n / e2e, 1),
        # From the last child body's last line to the parent's first line after
        # the gather (the child's completion write, the wake-up, the parent's
        # replay up to there).
        "resume_after_last_child_ms": round(resume * 1000, 2) if resume is not None else None,
        "parent_body_runs": RECORD.parent_enters,
        "check": check,
    }


SCENARIOS = {
    "step_overhead": step_overhead,
    "throughput": throughput,
    "plain": plain,
    "parked": parked,
    "fanout": fanout,
}


async def main() -> None:
    name, scenario, raw = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = json.loads(raw)
    RECORD.loop = asyncio.get_running_loop()
    RECORD.loop_thread = threading.get_ident()
    module = load_contender(name)
    contender = module.Contender(cfg["dsn"], RECORD, cfg)
    await contender.setup()
    try:
        result = await SCENARIOS[scenario](contender, cfg)
        result["settings"] = contender.settings(cfg)
        result["version"] = contender.version
    finally:
        await contender.close()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    if os.environ.get("PGS_BENCH_UVLOOP"):
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
