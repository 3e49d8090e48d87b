"""Periodic jobs across Scheduler *processes*: one run per window with five
replicas, disabling from one stops all, and the advisory lock dies with its holder."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support import periodic_tasks
from tests.support.common import child_pythonpath, wait_until

pytestmark = pytest.mark.slow


class Replica:
    """One ``tests.support.periodic_worker`` process and the JSON lines it prints."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.events: list[dict[str, Any]] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self, extra_env: dict[str, str] | None = None) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = child_pythonpath()
        env.update(extra_env or {})
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.periodic_worker",
            json.dumps(self.options),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                pass  # a log line

    def event(self, name: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == name), None)

    async def wait(self, timeout: float) -> int:
        assert self.proc is not None
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        if self._reader is not None:
            await self._reader
        return code

    def send(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()


@pytest.fixture
async def replicas():
    started: list[Replica] = []
    yield started
    for replica in started:
        replica.kill()
    for replica in started:
        try:
            await replica.wait(10)
        except Exception:
            pass


async def test_five_processes_run_each_window_once_and_disabling_in_one_stops_all(pool, replicas):
    await pool.execute(periodic_tasks.RUNS_TABLE)
    await pool.execute("TRUNCATE periodic_runs")
    for _ in range(5):
        replica = Replica({"declare": "tick", "dedup_key": "five", "every": 1.0})
        replicas.append(replica)
        await replica.start()
    await wait_until(
        lambda: all(r.event("ready") for r in replicas), timeout=15, message="five replicas"
    )
    all_up = datetime.fromtimestamp(max(r.event("ready")["at"] for r in replicas), UTC)
    # Ten seconds with all five up, then disable from one of them.
    await asyncio.sleep(max(0.0, (all_up - datetime.now(UTC)).total_seconds() + 10.5))
    replicas[0].send(signal.SIGUSR1)
    await wait_until(lambda: replicas[0].event("disabled"), timeout=5)
    await asyncio.sleep(2.5)
    for replica in replicas:
        replica.send(signal.SIGTERM)
    for replica in replicas:
        assert await replica.wait(timeout=15) == 0
    disabled = replicas[0].event("disabled")
    assert disabled["returned"] is True
    disabled_at = datetime.fromtimestamp(disabled["at"], UTC)

    rows = await pool.fetch(
        "SELECT job_id, status, execution_time, result::text AS result FROM scheduled_jobs "
        "WHERE task_name = 'periodic:five' ORDER BY execution_time"
    )
    # A run that starts after the next window has come yields to it (at most one
    # on a loaded machine); every other completed window ran its body.
    yielded = [r for r in rows if "coalesced" in (r["result"] or "")]
    assert len(yielded) <= 1, yielded
    windows = [r["execution_time"] for r in rows if r["status"] == "completed" and r not in yielded]
    runs = await pool.fetch("SELECT pid, started FROM periodic_runs ORDER BY started")
    # One run per window: as many body executions as windows that ran, each
    # starting within its own one-second window.
    assert len(runs) == len(windows)
    for window, run in zip(windows, runs, strict=True):
        assert window <= run["started"] < window + timedelta(seconds=1)
    assert len({r["execution_time"] for r in rows}) == len(rows)
    delays = sorted(
        (run["started"] - w).total_seconds() * 1000 for w, run in zip(windows, runs, strict=True)
    )
    print(
        f"\nfive replicas: {len(rows)} windows enqueued, {len(runs)} runs, "
        f"{len(yielded)} yielded, {len({r['pid'] for r in runs})} processes ran them; "
        f"window-to-start ms: median {delays[len(delays) // 2]:.1f}, "
        f"p90 {delays[int(len(delays) * 0.9)]:.1f}, max {delays[-1]:.1f}"
    )
    # Every window while all five were up, before the disable, ran: none
    # missed (windows at the edges may be).
    expected = []
    w = all_up.replace(microsecond=0) + timedelta(seconds=1)
    while w + timedelta(seconds=1) <= disabled_at:
        expected.append(w)
        w += timedelta(seconds=1)
    assert len(expected) >= 9
    enqueued = {r["execution_time"] for r in rows}
    assert set(expected) <= enqueued, sorted(set(expected) - enqueued)
    assert len(set(expected) - set(windows)) <= 1  # at most one yielded
    # The work was shared by the replicas, not done by a leader.
    assert len(Counter(r["pid"] for r in runs)) >= 2
    # Disabled from one process: no window later than the change reached the
    # database ran anywhere (one already enqueued may be cancelled).
    late = [r for r in rows if r["execution_time"] > disabled_at + timedelta(seconds=0.2)]
    assert all(r["status"] == "cancelled" for r in late), late
    assert not [r for r in runs if r["started"] > disabled_at + timedelta(seconds=1)]
    assert (
        await pool.fetchval("SELECT enabled FROM periodic_jobs WHERE dedup_key = 'five'") is False
    )


async def test_advisory_lock_is_released_when_its_holder_dies(pool, make_scheduler, replicas):
    await pool.execute(periodic_tasks.RUNS_TABLE)
    await pool.execute("TRUNCATE periodic_runs")
    holder = Replica({"declare": "locked", "dedup_key": "lock-death", "trigger": True})
    replicas.append(holder)
    await holder.start({"PERIODIC_LOCKED_SLEEP": "60"})
    await wait_until(
        lambda: pool.fetchval("SELECT count(*) FROM periodic_runs WHERE name = 'locked_sleeper'"),
        timeout=10,
        message="the holder to be running the job",
    )
    # This process declares the same job; while the holder runs, a run here is skipped.
    saved = periodic_tasks.runs.copy()
    importlib_registry = sys.modules["pg_scheduler.periodic"]._registry
    before = dict(importlib_registry)
    try:
        periodic_tasks.declare_locked_sleeper("lock-death")
        here = await make_scheduler()
        job_id = await here.trigger_periodic_job("lock-death")

        async def outcome(job: str) -> str | None:
            row = await pool.fetchrow(
                "SELECT status, result::text AS result FROM scheduled_jobs WHERE job_id = $1", job
            )
            if row is None or row["status"] != "completed":
                return None
            return "skipped" if "skipped" in (row["result"] or "") else "ran"

        await wait_until(lambda: outcome(job_id), timeout=10)
        assert await outcome(job_id) == "skipped"

        holder.kill()  # SIGKILL: no unlock, no rollback sent
        await holder.wait(10)
        started = time.monotonic()
        job_id = await here.trigger_periodic_job("lock-death")
        await wait_until(lambda: outcome(job_id), timeout=10)
        assert await outcome(job_id) == "ran"
        assert time.monotonic() - started < 5
    finally:
        importlib_registry.clear()
        importlib_registry.update(before)
        periodic_tasks.runs.clear()
        periodic_tasks.runs.update(saved)
