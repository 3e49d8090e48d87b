"""Process jobs stay supervised: nothing a worker starts outlives it or its job.

Each test runs a real worker (``tests.support.process_worker``, the CLI worker
started as a script) and reads ``/proc`` for what it leaves behind: children of the
worker (job processes, zombies among them) other than multiprocessing's own
resource tracker, which is started once and ends with the worker. Job bodies
record their own progress in files (``process_tasks``), so a test sees
whether a body ran, or kept running, after its job was recorded.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pg_scheduler import Scheduler
from tests.support import process_tasks
from tests.support.common import child_env, job_status, wait_for_status, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# Bigger than a pipe's buffer (64 KiB): sent with the job, it cannot be
# written while the process start is held.
BIG = "x" * 200_000


@pytest.fixture
async def producer(pool) -> AsyncIterator[Scheduler]:
    """Never started: it schedules, cancels, reads (its event listener closed at the end)."""
    scheduler = Scheduler(pool)
    yield scheduler
    await scheduler.shutdown()


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Proc:
    pid: int
    ppid: int
    state: str
    cmdline: str

    def __str__(self) -> str:
        return f"{self.pid} [{self.state}] {self.cmdline[:100]!r}"


def read_proc(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return Proc(pid, int(fields[1]), fields[0], raw.replace(b"\0", b" ").decode().strip())


def children(parent: int) -> list[Proc]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            proc = read_proc(int(entry))
            if proc is not None and proc.ppid == parent:
                found.append(proc)
    return found


def leftovers(worker: int) -> list[Proc]:
    """The worker's children but its (live) multiprocessing resource tracker."""
    return [p for p in children(worker) if p.state == "Z" or "resource_tracker" not in p.cmdline]


def running(pid: int) -> bool:
    proc = read_proc(pid)
    return proc is not None and proc.state != "Z"


async def ended_within(pid: int, timeout: float) -> bool:
    try:
        await wait_until(lambda: not running(pid), timeout=timeout)
    except AssertionError:
        return False
    return True


def ticks(path: Path) -> list[tuple[int, float]]:
    """(pid, time) of each tick a body wrote to ``path``."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        first, _, second = line.partition(" ")
        if first != "done":
            out.append((int(first), float(second)))
    return out


def finished(path: Path) -> bool:
    return path.exists() and "done" in path.read_text()


class Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.seen: set[int] = set()  # job processes seen, killed at the end if alive

    def job_processes(self) -> list[Proc]:
        found = leftovers(self.pid)
        self.seen.update(p.pid for p in found)
        return found

    async def stop(self) -> str:
        """SIGTERM (a graceful shutdown): it must exit 0 within 30 s."""
        self.proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(self.proc.communicate(), 30)
        assert self.proc.returncode == 0, err.decode()[-3000:]
        return err.decode()


def open_gate(gate: Path) -> None:
    gate.touch()


@asynccontextmanager
async def worker(dsn: str, gate: Path | None = None) -> AsyncIterator[Worker]:
    env = child_env(dsn)
    if gate is not None:
        env["PROCESS_TASKS_START_GATE"] = str(gate)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.process_worker",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    handle = Worker(proc)
    try:
        yield handle
    finally:
        if gate is not None:
            open_gate(gate)
        # What a failing run left behind must not outlive the test (first: a
        # job process holding the worker's stderr would hold proc.wait() too).
        handle.job_processes()
        for pid in handle.seen:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def remaining_after(w: Worker, timeout: float) -> list[str]:
    """The worker's job processes once there are none, or when ``timeout`` is up."""
    try:
        await wait_until(lambda: not w.job_processes(), timeout=timeout)
    except AssertionError:
        pass
    return [str(p) for p in w.job_processes()]


async def wait_no_job_processes(w: Worker, timeout: float, what: str) -> None:
    left = await remaining_after(w, timeout)
    assert left == [], f"job processes of the worker {timeout} s after {what}: {left}"


async def test_timeout_during_a_held_process_start_kills_the_child_before_recording(
    pool, dsn, tmp_path, producer
):
    """The timeout lands while each job's process is still starting (its start
    held at the gate): the child must be killed and reaped before the failure
    is written, and never run the body once the start is released."""
    gate = tmp_path / "gate"
    files = [tmp_path / f"ticks-{n}" for n in range(3)]
    async with worker(dsn, gate) as w:
        ids = [
            await producer.schedule(
                process_tasks.ticker,
                execution_time=now(),
                args=(str(path), 1.5, BIG),
                timeout=0.5,
            )
            for path in files
        ]
        for job_id in ids:
            await wait_for_status(pool, job_id, "failed", timeout=30)
        at_record = [str(p) for p in w.job_processes()]
        open_gate(gate)  # the start may go on now
        # A child that escaped would run its 1.5 s body and linger as a zombie.
        left = await remaining_after(w, 10)
        ran = {path.name: len(ticks(path)) for path in files if ticks(path)}
        assert (at_record, ran, left) == ([], {}, []), (
            f"job processes when the failures were recorded: {at_record}; "
            f"ticks of bodies that ran after their job timed out: {ran}; "
            f"job processes 10 s later: {left}"
        )
        for job_id in ids:
            job = await producer.get_job(job_id)
            assert "timed out after 0.5 s" in job.attempt_history[-1].error
        await w.stop()


async def test_cancel_during_a_held_process_start_kills_the_child(pool, dsn, tmp_path, producer):
    gate = tmp_path / "gate"
    files = [tmp_path / f"ticks-{n}" for n in range(3)]
    async with worker(dsn, gate) as w:
        ids = [
            await producer.schedule(
                process_tasks.ticker, execution_time=now(), args=(str(path), 1.5, BIG)
            )
            for path in files
        ]
        # Every job's process exists, held in its start.
        await wait_until(lambda: len(w.job_processes()) == 3, timeout=30, message="3 starts")
        for job_id in ids:
            assert await job_status(pool, job_id) == "running"
        cancelled_at = time.monotonic()
        for job_id in ids:
            assert await producer.cancel_job(job_id)
        await wait_no_job_processes(w, 10, "the cancels")
        print(f"cancelled in their start: gone {time.monotonic() - cancelled_at:.3f} s later")
        open_gate(gate)
        assert [await job_status(pool, job_id) for job_id in ids] == ["cancelled"] * 3
        # The next job starts unhindered: the pool counts no process of the
        # cancelled ones (they are gone).
        follow = await producer.schedule(
            process_tasks.ticker, execution_time=now(), args=(str(tmp_path / "follow"), 0.05)
        )
        assert (await producer.result(follow, timeout=30)) == 0
        assert {path.name: len(ticks(path)) for path in files if ticks(path)} == {}
        await wait_no_job_processes(w, 10, "the last job")
        await w.stop()


@pytest.mark.parametrize("parent_death_signal", [True, False], ids=["pdeathsig", "connection"])
async def test_a_job_process_dies_with_its_killed_worker(
    pool, dsn, tmp_path, producer, parent_death_signal
):
    """kill -9 of the worker kills its job process at once; the rescued re-run
    on another worker never overlaps it. Without the parent-death signal (the
    body clears it), the child's watch of its connection ends it."""
    path, marker = tmp_path / "ticks", tmp_path / "first-run"
    async with worker(dsn) as victim:
        job_id = await producer.schedule(
            process_tasks.long_first_run,
            execution_time=now(),
            args=(str(path), str(marker), parent_death_signal),
        )
        await wait_until(lambda: len(ticks(path)) >= 5, timeout=30, message="first run ticking")
        child = ticks(path)[0][0]
        victim.seen.add(child)
        assert read_proc(child).ppid == victim.pid
        async with worker(dsn) as survivor:
            victim.proc.send_signal(signal.SIGKILL)
            # (Not proc.wait(): it waits for the worker's stderr to close too,
            # and a job process that outlives it holds it open.) Gone, not only
            # a zombie: the leader is one while its other threads still exit.
            await wait_until(lambda: read_proc(victim.pid) is None, message="worker reaped")
            dead_at = time.time()
            ended = await ended_within(child, 5)
            print(f"job process gone {time.time() - dead_at:.3f} s after its worker was reaped")
            assert await producer.result(job_id, timeout=30) == "re-run"
            runs: dict[int, list[float]] = {}
            for pid, at in ticks(path):
                runs.setdefault(pid, []).append(at)
            rerun = [at for pid, times in runs.items() if pid != child for at in times]
            after_death = [at - dead_at for at in runs[child] if at > dead_at]
            finished = f"done {child}" in path.read_text()
            assert (ended, after_death, finished) == (True, [], False), (
                f"the job process {child} ended within 5 s of its worker's death: {ended}; "
                f"ticked {len(after_death)} times after it "
                f"(the last {max(after_death, default=0):.2f} s after); ran to its end: {finished}"
            )
            assert rerun and max(runs[child]) < min(rerun), "the first run overlapped the re-run"
            job = await producer.get_job(job_id)
            assert [a.outcome for a in job.attempt_history] == ["rescued", "completed"]
            await wait_no_job_processes(survivor, 10, "the re-run")
            await survivor.stop()


async def test_hung_job_processes_are_stopped_and_reaped(pool, dsn, tmp_path, producer):
    deaf, lingering = tmp_path / "deaf", tmp_path / "lingering"
    async with worker(dsn) as w:
        # Ignores SIGTERM: killed (SIGKILL) after the grace, then recorded.
        deaf_id = await producer.schedule(
            process_tasks.ignore_sigterm, execution_time=now(), args=(str(deaf), 30), timeout=2
        )
        # Sends its result, then never exits (a non-daemon thread): the result
        # counts, the process is stopped.
        linger_id = await producer.schedule(
            process_tasks.linger_after_result, execution_time=now(), args=(str(lingering),)
        )
        assert await producer.result(linger_id, timeout=30) == "sent"
        await wait_for_status(pool, deaf_id, "failed", timeout=30)
        assert w.job_processes() == []
        for path in (deaf, lingering):
            assert ticks(path), f"{path.name} never ran"
            assert not finished(path)
        job = await producer.get_job(deaf_id)
        assert "timed out after 2 s" in job.attempt_history[-1].error
        assert job.finished_at.timestamp() > max(at for _, at in ticks(deaf))
        await w.stop()


async def test_results_that_cannot_cross_fail_the_job_and_leave_no_zombie(
    pool, dsn, tmp_path, producer
):
    async with worker(dsn) as w:
        cases: list[tuple[Callable[[], object], str]] = [
            (process_tasks.unloadable, "could not be unpickled in the worker: ValueError"),
            (process_tasks.unpicklable, "could not be pickled: TypeError"),
        ]
        for func, message in cases:
            job_id = await producer.schedule(func, execution_time=now())
            await wait_for_status(pool, job_id, "failed", timeout=30)
            # Reaped before the failure was written (and not a zombie later).
            at_record = [str(p) for p in w.job_processes()]
            later = await remaining_after(w, 3)
            assert (at_record, later) == ([], []), func.__name__
            job = await producer.get_job(job_id)
            assert message in job.attempt_history[-1].error, job.attempt_history[-1].error
        await w.stop()
