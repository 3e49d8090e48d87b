"""The running job's context: ``pg_scheduler.current_job()``.

The worker sets it (one small object per job, in the job's own task) before
calling the function; everything else is computed when asked for.
"""

from __future__ import annotations

import asyncio
import math
import time
from contextvars import ContextVar, Token
from datetime import datetime
from typing import Any

from .enums import DEFAULT_QUEUE
from .store import Store
from .store.dependencies import DependencyStore
from .store.events import EventStore
from .support.codec import clip_text, decode_json
from .support.log import get_logger
from .support.validation import text_problem

log = get_logger(__name__)

#: At most this many progress writes per second per job; the latest value
#: reported is always written, at most 1/PROGRESS_WRITES_PER_SECOND later.
PROGRESS_WRITES_PER_SECOND = 4
PROGRESS_MESSAGE_MAX_CHARS = 1_000

_current: ContextVar[JobContext | None] = ContextVar("pg_scheduler_current_job", default=None)
# Delayed progress writes in flight (a task the loop holds only weakly).
_flushes: set[asyncio.Task[None]] = set()


class JobContext:
    """What a running job can know about itself, and its progress reports."""

    __slots__ = ("_events", "_flush", "_last_write", "_latest", "_row", "_running", "_store")

    def __init__(self, store: Store, running: Any, row: Any) -> None:
        self._store = store
        self._running = running
        self._row = row
        self._events: EventStore | None = None
        self._latest: tuple[float, str | None] | None = None
        self._last_write = -math.inf
        self._flush: asyncio.Task[None] | None = None

    @property
    def job_id(self) -> str:
        return self._running.job.job_id

    @property
    def attempt(self) -> int:
        return self._running.job.attempt

    @property
    def task(self) -> str:
        return self._running.job.task_name

    @property
    def queue(self) -> str:
        """The job's queue ("default" unless the task or the call named one)."""
        return self._row.get("queue") or DEFAULT_QUEUE

    @property
    def scheduled_at(self) -> datetime | None:
        return self._row.get("execution_time")

    async def dependency_results(self) -> dict[str, Any]:
        """``{job_id: result}`` of the jobs this one declared in ``depends_on``,
        in the order it declared them. A dependency that ended without
        completing (policy "run") maps to None, as does one whose completion
        deleted its row (vacuum's IMMEDIATE policy keeps no result). Read from
        the dependency edges, so a dependency's row may be vacuumed meanwhile."""
        store = DependencyStore(self._store.pool, self._store.schema)
        rows = await store.results(self.job_id)
        return {r["depends_on"]: decode_json(r["result"]) for r in rows}

    def cancelled(self) -> bool:
        """True once cancel_job() (or shutdown) asked this attempt to stop; the
        job's task is cancelled too, this tells it why at a checkpoint. A thread
        job (which cannot be killed) also sees True after its timeout: check it
        and return."""
        running = self._running
        return running.cancel_reason is not None or running.stopped

    async def report_progress(self, fraction: float, message: str | None = None) -> None:
        """Store progress (0.0 to 1.0) for get_job() and ``progress`` events.

        Rate-limited: the first report is written at once, later ones at most
        PROGRESS_WRITES_PER_SECOND times a second, always ending with the latest.
        """
        self._latest = _checked_progress(fraction, message)
        if self._flush is not None:
            return  # the scheduled write takes the latest value
        wait = self._until_next_write()
        if wait <= 0:
            await self._write()
            return
        self._write_in(wait)

    def set_progress(self, fraction: float, message: str | None = None) -> None:
        """:meth:`report_progress` without waiting for the write, callable from
        the job's thread (a plain ``def`` task on the thread executor) as well
        as from async code. The value is checked here (TypeError/ValueError);
        the write is done on the worker's event loop, rate-limited like
        report_progress, and the latest value is always written."""
        latest = _checked_progress(fraction, message)
        loop = self._running.task.get_loop()
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self._offer(latest)
            return
        try:
            loop.call_soon_threadsafe(self._offer, latest)
        except RuntimeError:  # the loop is closed: the worker has stopped
            log.warning("progress not written: the worker has stopped", job_id=self.job_id)

    def _offer(self, latest: tuple[float, str | None]) -> None:
        """On the loop: take ``latest`` and make sure a write will take it."""
        self._latest = latest
        if self._flush is None:
            self._write_in(max(0.0, self._until_next_write()))

    def _until_next_write(self) -> float:
        """Seconds until the rate limit allows the next write (<= 0: now)."""
        return self._last_write + 1 / PROGRESS_WRITES_PER_SECOND - time.monotonic()

    def _write_in(self, delay: float) -> None:
        task = asyncio.get_running_loop().create_task(self._write_later(delay))
        self._flush = task
        _flushes.add(task)
        task.add_done_callback(_flushes.discard)

    async def _write_later(self, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        self._flush = None
        await self._write()

    async def _write(self) -> None:
        latest = self._latest
        if latest is None:
            return
        self._last_write = time.monotonic()
        if self._events is None:
            self._events = EventStore(self._store.pool, self._store.schema)
        try:
            await self._events.write_progress(self.job_id, self.attempt, *latest)
        except Exception as exc:
            log.warning("progress not written", job_id=self.job_id, error=repr(exc))


def _checked_progress(fraction: float, message: str | None) -> tuple[float, str | None]:
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise TypeError(f"fraction must be a number, got {type(fraction).__name__}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be between 0 and 1, got {fraction!r}")
    if message is not None:
        if not isinstance(message, str):
            raise TypeError(f"message must be a str or None, got {type(message).__name__}")
        problem = text_problem(message)
        if problem is not None:
            raise ValueError(f"message {problem}")
        message = clip_text(message, PROGRESS_MESSAGE_MAX_CHARS)
    return float(fraction), message


def enter_job(store: Store, running: Any, row: Any) -> Token[JobContext | None]:
    """Called by the worker in the job's task, before the function runs; give
    the token to :func:`leave_job` once the job's outcome is decided."""
    return _current.set(JobContext(store, running, row))


def leave_job(token: Token[JobContext | None]) -> None:
    """Called by the worker in the job's task when the job is over. The task's
    context holds the job's context, which holds the task (to cancel it): a
    reference cycle per job, left to the cyclic garbage collector, whose full
    collections then stall the event loop for tens of milliseconds under a
    drain. Resetting the variable breaks the cycle, so the job's objects are
    freed at once. Tasks the job started keep their own copy."""
    _current.reset(token)


def current_job() -> JobContext:
    """The context of the job running in this task; RuntimeError outside a job."""
    context = _current.get()
    if context is None:
        raise RuntimeError("current_job() called outside a running pg_scheduler job")
    return context
