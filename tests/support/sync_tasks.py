"""Plain-function tasks for test_executors (the process ones are imported by name in a child)."""

from __future__ import annotations

import os
import threading
import time

from pg_scheduler import current_job, task

sleeping = threading.Event()
saw_cancel = threading.Event()
release = threading.Event()


@task(name="sync.sleep_one", executor="thread")
def sleep_one() -> str:
    sleeping.set()
    time.sleep(1)
    return threading.current_thread().name


@task(name="sync.wait_for_cancel", executor="thread")
def wait_for_cancel() -> str:
    job = current_job()  # copied into the thread
    sleeping.set()
    while not job.cancelled():
        time.sleep(0.01)
    saw_cancel.set()
    release.wait(30)  # still running after its outcome is recorded
    return "returned"


@task(name="sync.add", executor="process")
def sync_add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b, "pid": os.getpid()}


@task(name="sync.boom", executor="process")
def sync_boom() -> None:
    raise ValueError("boom in the child")


@task(name="sync.hang", executor="process")
def sync_hang(pid_file: str) -> None:
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)


@task(name="sync.ignore_timeout", executor="thread")
def ignore_timeout() -> str:
    sleeping.set()
    while not current_job().cancelled():
        time.sleep(0.01)
    saw_cancel.set()
    release.wait(30)
    return "too late"


# A timed-out thread job's retry must not start while its old thread runs.
overlap = {"active": 0, "max_active": 0, "runs": 0}
overlap_lock = threading.Lock()


@task(name="sync.slow_first_run", executor="thread")
def slow_first_run() -> int:
    with overlap_lock:
        overlap["active"] += 1
        overlap["runs"] += 1
        overlap["max_active"] = max(overlap["max_active"], overlap["active"])
        run = overlap["runs"]
    try:
        if run == 1:
            sleeping.set()
            release.wait(30)  # ignores its timeout's signal
        return run
    finally:
        with overlap_lock:
            overlap["active"] -= 1


@task(name="sync.sleep_three", executor="thread")
def sleep_three() -> str:
    sleeping.set()
    time.sleep(3)
    return "slept"


progress_gate = threading.Event()
progress_halfway = threading.Event()
progress_end_gate = threading.Event()


@task(name="sync.progress_steps", executor="thread")
def progress_steps(steps: int) -> list[str]:
    """Reports progress from its thread: half, a wait at the gate, then the rest
    in a burst, then a wait at the end gate (still running, so its progress
    events are sent); returns the errors bad values raised at the call."""
    job = current_job()
    job.set_progress(0.5, "halfway")
    progress_halfway.set()
    progress_gate.wait(30)
    for n in range(1, steps + 1):
        job.set_progress(0.5 + 0.5 * n / steps, f"step {n}")
    refused = []
    for bad in (1.5, -0.1, float("nan"), True, "0.5", None):
        try:
            job.set_progress(bad)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            refused.append(type(exc).__name__)
    try:
        job.set_progress(0.9, 42)  # type: ignore[arg-type]
    except TypeError as exc:
        refused.append(type(exc).__name__)
    progress_end_gate.wait(30)
    return refused


@task(name="sync.mark_thread", executor="thread")
def mark_thread(path: str) -> int:
    """Leaves a file at ``path`` (its start, for the rate tests); returns its thread's id."""
    with open(path, "w") as out:
        out.write(str(time.time()))
    return threading.get_ident()


@task(name="sync.mark_process", executor="process")
def mark_process(path: str) -> int:
    """Leaves a file at ``path`` from its own process; returns that process's id."""
    with open(path, "w") as out:
        out.write(str(time.time()))
    return os.getpid()
