"""Awaiting a job from any process: wait_for(), result(), run(); and subscribing
to events. A part of :class:`~pg_scheduler.Scheduler` (:class:`Results`).

A waiter registers with the Scheduler's :class:`~pg_scheduler.notify.events.EventHub`
(no connection of its own: every waiter shares the one LISTEN connection),
then reads the job; a final-state event wakes it, and a poll (every
``POLL_LIVE`` seconds, ``POLL_DOWN`` while notifications are down) is the
safety net for a notification that was lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from ..enums import FINAL_STATUSES, JobStatus
from ..models import Job
from ..notify.events import Event, EventHub, Subscription
from .settings import Settings

POLL_LIVE = 5.0
POLL_DOWN = 0.5


class JobNotFound(LookupError):
    """No job with this id (never scheduled, or deleted: vacuumed, or completed
    with the "immediate" vacuum trigger, which deletes the row)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id {job_id!r}")
        self.job_id = job_id


class JobError(Exception):
    """A job did not complete; :attr:`job` is its final state."""

    def __init__(self, job: Job, message: str) -> None:
        super().__init__(message)
        self.job = job


class JobFailed(JobError):
    """The job failed; :attr:`error` and :attr:`traceback` are the last attempt's,
    formatted in the worker process that ran it."""

    def __init__(self, job: Job) -> None:
        super().__init__(job, f"job {job.job_id} failed: {job.error}")
        self.error = job.error
        self.traceback = job.traceback


class JobCancelled(JobError):
    def __init__(self, job: Job) -> None:
        super().__init__(job, f"job {job.job_id} was cancelled")


class JobExpired(JobError):
    def __init__(self, job: Job) -> None:
        super().__init__(job, f"job {job.job_id} expired: {job.error}")


def outcome(job: Job) -> Any:
    """The stored result of a completed job; raises for any other final state."""
    if job.status is JobStatus.COMPLETED:
        return job.result
    if job.status is JobStatus.FAILED:
        raise JobFailed(job)
    if job.status is JobStatus.CANCELLED:
        raise JobCancelled(job)
    raise JobExpired(job)


class Results:
    """Awaiting jobs and subscribing to events, through the Scheduler's event hub."""

    def __init__(
        self,
        *,
        hub: EventHub,
        settings: Settings,
        get_job: Callable[[str], Awaitable[Job | None]],
        schedule: Callable[..., Awaitable[str]],
    ) -> None:
        """``get_job`` and ``schedule``: the Scheduler's (``settings`` tells
        whether notifications can work at all)."""
        self.hub = hub
        self.settings = settings
        self._get_job = get_job
        self._schedule = schedule

    async def wait_for(self, job_id: str, timeout: float | None = None) -> Job:
        """The job once it is completed, failed, cancelled or expired.

        Raises :class:`JobNotFound` at once for an unknown id (or if the row
        disappears while waiting), TimeoutError after ``timeout`` seconds.
        """
        if not isinstance(job_id, str):
            raise TypeError(f"job_id must be a str, got {type(job_id).__name__}")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        hub = self.hub
        # A listener still connecting delays the first read by at most this.
        notified = self.settings.notifications and await hub.listening(
            10.0 if timeout is None else min(10.0, timeout)
        )
        future = hub.watch(job_id)
        try:
            if notified:  # completions are sent only while someone waits for them
                await hub.want_quietly(("completed",))
            while True:
                job = await self._get_job(job_id)
                if job is None:
                    raise JobNotFound(job_id)
                if job.status in FINAL_STATUSES:
                    return job
                # Events end the wait early; just after a new completion flag, one
                # may not come (the statement began before it): poll sooner.
                events = notified and hub.live and not hub.flags_settling()
                wait = POLL_LIVE if events else POLL_DOWN
                if deadline is not None:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise TimeoutError(f"job {job_id} not finished after {timeout} s")
                    wait = min(wait, remaining)
                await asyncio.wait({future}, timeout=wait)
                if future.done():
                    future = hub.watch(job_id)
        finally:
            hub.unwatch(job_id, future)

    async def result(self, job_id: str, timeout: float | None = None) -> Any:
        """The job's result once final (see :func:`outcome`)."""
        return outcome(await self.wait_for(job_id, timeout))

    async def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Schedule ``func(*args, **kwargs)`` now and return its result."""
        job_id = await self._schedule(
            func, execution_time=datetime.now(UTC), args=args, kwargs=kwargs
        )
        return await self.result(job_id)

    def events(
        self,
        kinds: Any = None,
        *,
        task: str | None = None,
        queue: str | None = None,
        maxsize: int = 10_000,
    ) -> Subscription:
        """A subscription to events from every process (EventHub.subscribe)."""
        return self.hub.subscribe(kinds, task=task, queue=queue, maxsize=maxsize)

    def on(self, kind: Any, callback: Callable[[Event], Any], **filters: Any) -> Subscription:
        """Call ``callback(event)`` for each event of ``kind`` (EventHub.on)."""
        return self.hub.on(kind, callback, **filters)
