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
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import multiprocessing
import os
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

_SPAWN = multiprocessing.get_context("spawn")


class ProcessJobError(Exception):
    """The function raised in its process (the child's traceback is a note)."""


def _child_main(conn: Connection, module: str, qualname: str, args: Any, kwargs: Any) -> None:
    # Runs in the spawned process: import the function by name, call it, send the outcome.
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        conn.send(("ok", obj(*args, **kwargs)))
    except BaseException as exc:
        conn.send(("err", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        conn.close()


def _receive(conn: Connection, proc: Any) -> tuple[Any, int | None]:
    # In a waiter thread: the outcome (None if the child died first), then reap it.
    try:
        message = conn.recv()
    except (EOFError, OSError):
        message = None
    finally:
        conn.close()
    proc.join()
    return message, proc.exitcode


class SyncRunners:
    """The thread pool and the process limit of one worker, created on first use."""

    def __init__(self, thread_pool_size: int, process_pool_size: int) -> None:
        self.thread_pool_size = thread_pool_size
        self.process_pool_size = process_pool_size
        self._threads: ThreadPoolExecutor | None = None
        self._waiters: ThreadPoolExecutor | None = None
        self._processes: asyncio.Semaphore | None = None
        #: pid of each live child, by job id (tests and logs look here).
        self.pids: dict[str, int] = {}

    async def run_thread(self, running: Any, func: Any, args: Any, kwargs: Any) -> Any:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                self.thread_pool_size, thread_name_prefix="pg_scheduler-job"
            )
        # The copy carries current_job() into the thread.
        call = functools.partial(contextvars.copy_context().run, func, *args, **kwargs)
        future: Future[Any] = self._threads.submit(call)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            running.stopped = True
            if not future.done():
                running.linger = future  # still running: its slot stays taken
            raise

    async def run_process(self, running: Any, func: Any, args: Any, kwargs: Any) -> Any:
        if self._processes is None:
            self._processes = asyncio.Semaphore(self.process_pool_size)
            self._waiters = ThreadPoolExecutor(
                self.process_pool_size, thread_name_prefix="pg_scheduler-proc-wait"
            )
        assert self._waiters is not None
        loop = asyncio.get_running_loop()
        job_id = running.job.job_id
        async with self._processes:
            receiver, sender = _SPAWN.Pipe(duplex=False)
            proc = _SPAWN.Process(
                target=_child_main,
                args=(sender, func.__module__, func.__qualname__, args, kwargs),
                name=f"pg_scheduler-job-{job_id}",
                daemon=True,
            )
            try:
                # start() pickles and forks/execs: keep it off the loop.
                await loop.run_in_executor(self._waiters, proc.start)
            finally:
                sender.close()
            if proc.pid is not None:
                self.pids[job_id] = proc.pid
            waiter = loop.run_in_executor(self._waiters, _receive, receiver, proc)
            try:
                message, exitcode = await asyncio.shield(waiter)
            except asyncio.CancelledError:
                # Cancel or timeout: really stop it, and reap it before the slot is given back.
                running.stopped = True
                proc.kill()
                await asyncio.shield(waiter)
                raise
            finally:
                self.pids.pop(job_id, None)
        if message is None:
            raise ProcessJobError(f"the job's process exited with code {exitcode} and no result")
        if message[0] == "ok":
            return message[1]
        error = ProcessJobError(message[1])
        error.add_note(f"in process {proc.pid}:\n{message[2]}")
        raise error

    def close(self) -> None:
        """Stop the pools without waiting (a lingering thread ends on its own)."""
        for pool in (self._threads, self._waiters):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._threads = self._waiters = None
        self._processes = None


def default_process_pool_size() -> int:
    return os.cpu_count() or 1
