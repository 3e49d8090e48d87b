"""Process-executor tasks whose bodies record their own progress, for
test_process_supervision (run by ``process_worker.py``).

A ticking body appends ``<pid> <time.time()>`` to its file every few
milliseconds and ``done <pid>`` when it reaches its end, so a test can see
whether it ran at all, and whether it kept running after its job was
recorded failed or cancelled.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from typing import Any

from pg_scheduler import task

TICK = 0.005


def _tick(path: str, seconds: float) -> None:
    pid = os.getpid()
    end = time.monotonic() + seconds
    with open(path, "a", buffering=1) as out:
        while time.monotonic() < end:
            out.write(f"{pid} {time.time():.6f}\n")
            time.sleep(TICK)
        out.write(f"done {pid}\n")


@task(name="proc.ticker", executor="process")
def ticker(path: str, seconds: float, payload: str = "") -> int:
    """Ticks for ``seconds``. ``payload`` only makes the arguments big."""
    _tick(path, seconds)
    return len(payload)


@task(name="proc.long_first_run", executor="process")
def long_first_run(path: str, marker: str, parent_death_signal: bool = True) -> str:
    """The first run (no ``marker`` yet) ticks for 30 s; a re-run for 0.3 s.
    ``parent_death_signal=False`` clears the signal the process asked for at
    its death of its worker (as on a platform without one)."""
    if not parent_death_signal:
        ctypes.CDLL(None, use_errno=True).prctl(1, ctypes.c_ulong(0), 0, 0, 0)  # PR_SET_PDEATHSIG
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        _tick(path, 0.3)
        return "re-run"
    os.close(fd)
    _tick(path, 30)
    return "first run"


@task(name="proc.ignore_sigterm", executor="process")
def ignore_sigterm(path: str, seconds: float) -> None:
    """Ticks with SIGTERM ignored (a child that does not stop when asked)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _tick(path, seconds)


@task(name="proc.linger_after_result", executor="process")
def linger_after_result(path: str) -> str:
    """Returns at once but leaves a non-daemon thread ticking for 30 s: the
    process sends its result, then does not exit."""
    threading.Thread(target=_tick, args=(path, 30), daemon=False).start()
    return "sent"


@task(name="proc.unpicklable", executor="process")
def unpicklable() -> Any:
    return threading.Lock()


class Unloadable:
    """Pickles fine; unpickling raises ValueError (int("not a number"))."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (int, ("not a number",))


@task(name="proc.unloadable", executor="process")
def unloadable() -> Any:
    return Unloadable()


SETTINGS = {
    "max_concurrent_jobs": 10,
    "process_pool_size": 4,
    "vacuum_enabled": False,
    "run_periodic_jobs": False,
    "heartbeat_interval": 0.3,
    "heartbeat_threshold": 2.0,
    "lease_duration": 3.0,
    "rescue_interval": 0.5,
}
