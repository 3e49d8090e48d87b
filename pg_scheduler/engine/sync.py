"""Plain (``def``) task functions: run in a thread pool or in a spawned process.

Only tasks registered with ``executor="thread"`` or ``"process"`` come here;
an async job never does (the executor checks one attribute set at registration).

Threads cannot be killed: on cancel or timeout the job's outcome is recorded
at once, ``current_job().cancelled()`` turns True, and the thread is left to
return; the caller keeps counting its slot until it does (``RunningJob.linger``).

Processes are: each process job gets its own spawned child, at most
``process_pool_size`` at once. A ProcessPoolExecutor cannot stop one job
without killing the pool (and every other job in it); one child per job can be
killed alone. The price is a process start (~0.1 s) per job.

Nothing a job process does outlives its supervision:

- One waiter thread owns each child from start to reap (:class:`_JobProcess`):
  it starts it, sends the arguments, waits for the outcome or the exit, and
  always reaps it. The pool slot is given back only when that thread ends.
- A cancel or timeout asks that child to stop: SIGTERM at once if it exists,
  or as soon as its start returns (a stop asked before the start means no
  start); SIGKILL ``TERM_GRACE`` seconds later if it still runs. The job's
  task waits for the reap, so a timeout is recorded only once its process is
  gone.
- A child dies with its worker: on Linux it asks for SIGKILL when the thread
  that started it ends (``PR_SET_PDEATHSIG``; that thread lives until the
  reap, so it ends early only with the whole process), checks that the worker
  had not died already, and on every platform a thread in the child exits
  it when the worker's end of its connection closes (the kernel closes it
  when the worker dies, kill -9 included).
- A child that has sent its result has ``EXIT_GRACE`` seconds to exit on its
  own (a non-daemon thread would keep it alive), then is stopped the same way.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import functools
import importlib
import multiprocessing
import os
import selectors
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from ..support.log import get_logger

log = get_logger("pg_scheduler.worker")

_SPAWN = multiprocessing.get_context("spawn")

#: Seconds a job process has to exit after SIGTERM before it gets SIGKILL.
TERM_GRACE = 1.0
#: Seconds a job process that has sent its result has to exit on its own.
EXIT_GRACE = 1.0

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_ORPHANED = 70  # a child's exit status when it ends because its worker is gone


class ProcessJobError(Exception):
    """The function raised in its process (the child's traceback is a note)."""


class NotStarted(Exception):
    """The gate a job was given said no, just before its function would start:
    it did not run. ``verdict``: what the gate returned."""

    def __init__(self, verdict: object) -> None:
        super().__init__(f"not started: {verdict!r}")
        self.verdict = verdict


#: Called just before a sync job's function starts (in the thread that starts
#: it): anything but True stops the start (NotStarted).
Gate = Callable[[], object]


def _gated(gate: Gate, func: Any, /, *args: Any, **kwargs: Any) -> Any:
    verdict = gate()
    if verdict is not True:
        raise NotStarted(verdict)
    return func(*args, **kwargs)


# -- in the child ---------------------------------------------------------------------


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}"


def _die_with_parent(parent_pid: int) -> None:
    # SIGKILL when the thread that started this process ends (Linux only; the
    # waiter thread lives until this process is reaped, so it ends early only
    # with the whole worker).
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the connection watch still ends it
    if os.getppid() != parent_pid:
        os._exit(_ORPHANED)  # the worker died before the signal was asked for


def _watch_parent(fd: int) -> None:
    # The worker never writes again after the arguments: the connection turns
    # readable only when the worker's end closes, that is when the worker is gone.
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        selector.select()
    os._exit(_ORPHANED)


def _child_main(conn: Connection, parent_pid: int, module: str, qualname: str) -> None:
    # Runs in the spawned process: import the function by name, call it with
    # the arguments the worker sends, send the outcome back.
    _die_with_parent(parent_pid)
    try:
        args, kwargs = conn.recv()
    except (EOFError, OSError):
        os._exit(_ORPHANED)
    # Its own descriptor: the watch goes on whatever happens to ``conn``.
    watched = os.dup(conn.fileno())
    threading.Thread(
        target=_watch_parent, args=(watched,), name="pg_scheduler-worker-watch", daemon=True
    ).start()
    message: tuple[Any, ...]
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        message = ("ok", obj(*args, **kwargs))
    except BaseException as exc:
        message = ("err", _describe(exc), traceback.format_exc())
    try:
        conn.send(message)
    except Exception as exc:
        text = f"the job's result could not be pickled: {_describe(exc)}"
        conn.send(("err", text, traceback.format_exc()))
    finally:
        conn.close()


# -- in the worker --------------------------------------------------------------------


class _JobProcess:
    """One job's process, owned by the waiter thread that runs :meth:`run`.

    Other threads (the loop on cancel or timeout, :meth:`SyncRunners.close`)
    only call :meth:`stop`. Signals are sent under a lock that the reaping
    thread also takes, so none reaches a process id after its reap.
    """

    def __init__(
        self, job_id: str, func: Any, args: Any, kwargs: Any, gate: Gate | None = None
    ) -> None:
        self.job_id = job_id
        self.gate = gate
        self.module: str = func.__module__
        self.qualname: str = func.__qualname__
        self.arguments = (args, kwargs)
        self.pid: int | None = None
        self._lock = threading.Lock()
        self._stop: int | None = None  # the strongest signal asked for so far
        self._proc: BaseProcess | None = None
        self._pidfd: int | None = None
        self._reaped = False

    def stop(self, sig: int) -> None:
        """Ask the process to end: ``sig`` now if it runs, or once it is started."""
        with self._lock:
            if self._stop != signal.SIGKILL:
                self._stop = sig
            self._signal(sig)

    def _signal(self, sig: int) -> None:
        # With the lock held.
        if self._proc is None or self._reaped:
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            elif self._proc.exitcode is None:  # (polls: a reap elsewhere is seen)
                os.kill(self._proc.pid, sig)  # type: ignore[arg-type]
        except ProcessLookupError:
            pass  # it has exited already

    def run(self, on_start: Callable[[_JobProcess], None]) -> tuple[Any, int | None]:
        """In a waiter thread: start, send the arguments, wait for the outcome
        (or the exit), reap. Returns (message or None, exit code)."""
        with self._lock:
            if self._stop is not None:
                return None, None  # stopped before it was started
        ours, theirs = _SPAWN.Pipe()
        try:
            proc = _SPAWN.Process(
                target=_child_main,
                args=(theirs, os.getpid(), self.module, self.qualname),
                name=f"pg_scheduler-job-{self.job_id}",
                daemon=True,
            )
            try:
                proc.start()
            finally:
                theirs.close()
            self._adopt(proc)
            on_start(self)
            try:
                verdict = True if self.gate is None else self.gate()
                if verdict is not True:
                    ours.close()  # no arguments: the child's wait for them ends, it exits
                    message = ("not started", verdict)
                else:
                    message = self._exchange(ours)
                    if message is not None:
                        self._let_exit()
            finally:
                self._reap(proc)
            return message, proc.exitcode
        finally:
            ours.close()

    def _adopt(self, proc: BaseProcess) -> None:
        pidfd = None
        if hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(proc.pid)  # type: ignore[arg-type]
            except OSError:
                pidfd = None
            if pidfd is not None and proc.exitcode is not None:
                # Already reaped (another start polls every child) before the
                # pidfd was opened: it may name another process. Do without.
                os.close(pidfd)
                pidfd = None
        with self._lock:
            self._proc, self._pidfd, self.pid = proc, pidfd, proc.pid
            if self._stop is not None:
                self._signal(self._stop)  # a cancel or timeout came during the start

    def _exit_handle(self) -> Any:
        assert self._proc is not None
        return self._pidfd if self._pidfd is not None else self._proc.sentinel

    def _exited(self, timeout: float | None) -> bool:
        return bool(wait([self._exit_handle()], timeout))

    def _exchange(self, conn: Connection) -> Any:
        # The outcome, or None if the process ended without sending one.
        try:
            conn.send(self.arguments)
            wait([conn, self._exit_handle()])
            if not conn.poll():
                return None  # exited; its end of the connection held open elsewhere
            return conn.recv()
        except (EOFError, OSError):
            return None
        except Exception as exc:
            text = f"the job's result could not be unpickled in the worker: {_describe(exc)}"
            return ("err", text, traceback.format_exc())

    def _let_exit(self) -> None:
        # The outcome is in: the process ends by itself, or is ended.
        if self._exited(EXIT_GRACE):
            return
        log.warning(
            "job process did not exit after sending its result; stopping it",
            job_id=self.job_id,
            pid=self.pid,
        )
        self.stop(signal.SIGTERM)
        if not self._exited(TERM_GRACE):
            self.stop(signal.SIGKILL)

    def _reap(self, proc: BaseProcess) -> None:
        self._exited(None)
        with self._lock:
            self._reaped = True
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        proc.join()


class SyncRunners:
    """The thread pool and the process limit of one worker, created on first use."""

    def __init__(self, thread_pool_size: int, process_pool_size: int) -> None:
        self.thread_pool_size = thread_pool_size
        self.process_pool_size = process_pool_size
        self._threads: ThreadPoolExecutor | None = None
        self._waiters: ThreadPoolExecutor | None = None
        self._processes: asyncio.Semaphore | None = None
        #: Job processes not yet reaped (each holds a pool slot until it is).
        self._live: set[_JobProcess] = set()
        #: pid of each live child, by job id (tests and logs look here).
        self.pids: dict[str, int] = {}

    async def run_thread(
        self, running: Any, func: Any, args: Any, kwargs: Any, gate: Gate | None = None
    ) -> Any:
        """Run ``func`` in the pool (``gate``: asked in the thread first)."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                self.thread_pool_size, thread_name_prefix="pg_scheduler-job"
            )
        # The copy carries current_job() into the thread.
        if gate is not None:
            args, func = (gate, func, *args), _gated
        call = functools.partial(contextvars.copy_context().run, func, *args, **kwargs)
        future: Future[Any] = self._threads.submit(call)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            running.stopped = True
            if not future.done():
                running.linger = future  # still running: its slot stays taken
            raise

    async def run_process(
        self, running: Any, func: Any, args: Any, kwargs: Any, gate: Gate | None = None
    ) -> Any:
        """Run ``func`` in a process of its own (``gate``: asked in the thread
        that owns it, once it is started, before it gets the arguments)."""
        if self._processes is None or self._waiters is None:
            self._processes = asyncio.Semaphore(self.process_pool_size)
            # One thread per live process: each owns its process until the reap.
            self._waiters = ThreadPoolExecutor(
                self.process_pool_size, thread_name_prefix="pg_scheduler-proc-wait"
            )
        processes, waiters = self._processes, self._waiters
        await processes.acquire()
        child = _JobProcess(running.job.job_id, func, args, kwargs, gate)
        try:
            future = asyncio.get_running_loop().run_in_executor(waiters, child.run, self._started)
        except BaseException:
            processes.release()
            raise
        self._live.add(child)
        future.add_done_callback(functools.partial(self._ended, child, processes))
        try:
            message, exitcode = await asyncio.shield(future)
        except asyncio.CancelledError:
            # Cancel or timeout: stop it, and wait for the reap before the
            # outcome is recorded (and the slot given back).
            running.stopped = True
            await self._stop(child, future)
            raise
        if message is None:
            raise ProcessJobError(f"the job's process exited with code {exitcode} and no result")
        if message[0] == "ok":
            return message[1]
        if message[0] == "not started":
            raise NotStarted(message[1])
        error = ProcessJobError(message[1])
        error.add_note(f"in process {child.pid}:\n{message[2]}")
        raise error

    def _started(self, child: _JobProcess) -> None:
        # In the waiter thread, once the process exists.
        if child.pid is not None:
            self.pids[child.job_id] = child.pid

    def _ended(
        self, child: _JobProcess, processes: asyncio.Semaphore, future: asyncio.Future[Any]
    ) -> None:
        # On the loop, once the waiter thread has reaped the process (or never started it).
        if not future.cancelled():
            future.exception()  # read here too: a stopped job's task does not
        processes.release()
        self._live.discard(child)
        if child.pid is not None and self.pids.get(child.job_id) == child.pid:
            del self.pids[child.job_id]

    async def _stop(self, child: _JobProcess, future: asyncio.Future[Any]) -> None:
        child.stop(signal.SIGTERM)
        try:
            done, _ = await asyncio.wait([future], timeout=TERM_GRACE)
            if not done:
                log.warning(
                    f"job process still running {TERM_GRACE:g} s after SIGTERM; killing it",
                    job_id=child.job_id,
                    pid=child.pid,
                )
                child.stop(signal.SIGKILL)
                await asyncio.wait([future])
        except asyncio.CancelledError:
            # Stopped waiting (the worker is torn down): kill it; its thread reaps it.
            child.stop(signal.SIGKILL)
            log.warning(
                "stopped waiting for a job process; killed it, its thread reaps it",
                job_id=child.job_id,
                pid=child.pid,
            )
            raise

    def close(self) -> None:
        """Stop the pools without waiting (a lingering thread ends on its own).
        A job process still running is killed; its waiter thread reaps it."""
        live = list(self._live)
        if live:
            log.warning(
                "job processes still running at shutdown; killing them",
                jobs=[child.job_id for child in live],
            )
        for child in live:
            child.stop(signal.SIGKILL)
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._waiters is not None:
            # Not cancel_futures: every queued start must see its stop and return.
            self._waiters.shutdown(wait=False)
        self._threads = self._waiters = None
        self._processes = None


def default_process_pool_size() -> int:
    return os.cpu_count() or 1
