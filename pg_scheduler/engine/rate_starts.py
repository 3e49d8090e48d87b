"""Starts of rate-limited jobs (per-key rates, and global rate limits of a
task or queue): each function starts within the rate window's margin of its
stamp.

The keyed claim stamps a start for each rate-limited job it takes
(``scheduler_key_starts``), and the limited claim on each rate-limited limit
row (``scheduler_limits.recent_starts``), the database's clock as the
statement runs; both count starts over the period plus a margin
(:meth:`LimitStore.margin <pg_scheduler.store.limits.LimitStore.margin>`). That
holds the functions' starts to the rate, as the functions' own clocks time
them, as long as each function starts within the margin after its stamp:
then the functions that start in any span of one period have their stamps
within one period plus the margin, and the claims keep such a span to the
rate's count.

The stamp comes after the claim was sent, so the worker bounds the gap on its
own monotonic clock: a job whose function would start later than the margin
after its claim was sent (the loop was busy, the row waited for a slot) is
stamped again first, under its key's lock (or its limit rows' locks): its old
stamp goes, and a new one is written now if the other starts in the window
leave room. With no room the job is handed back to pending (its attempt not
spent) and a later claim takes it when the window has room. Either way no
start is ever counted earlier than the function's own.

A thread job is checked in its thread, just before its function is called,
and a process job in the thread that owns its process, just before the
arguments are sent (the process waits for them): the process start (about
0.1 s) comes before the check, so a rate-limited process job is always
stamped again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from ..store import Store
from ..store.limits import LimitStore

#: Entries of rows that never started here are dropped FORGET_AFTER seconds
#: past their deadline, once more than FORGET_PAST are kept.
FORGET_PAST = 1_000
FORGET_AFTER = 300.0
#: Seconds a thread waits for the loop to move a stamp.
THREAD_WAIT = 10.0


class Stamped(NamedTuple):
    """A claimed job's start stamp, as the worker knows it."""

    #: Monotonic time by which the function must start (claim sent + margin).
    deadline: float
    margin: float
    #: A keyed claim's: the key, its rate's count and period (seconds).
    key: str | None = None
    most: int = 0
    period: float = 0.0
    #: A limited claim's: the job's task and queue, and the claim's stamp.
    task: str = ""
    queue: str = ""
    stamp: datetime | None = None


class RateStarts:
    """The claim's send time of each rate-limited job not started yet, and
    the check just before its function starts (see the module docstring)."""

    def __init__(self, store: Store, worker_id: str) -> None:
        self.store = store
        self.worker_id = worker_id
        self.stamped: dict[str, Stamped] = {}

    def _forget_old(self, now: float) -> None:
        stamped = self.stamped
        if len(stamped) > FORGET_PAST:
            # Rows handed back unstarted (a paused queue, the buffer) leave
            # their entry: drop those long past their deadline.
            old = now - FORGET_AFTER
            for job_id in [j for j, e in stamped.items() if e.deadline < old]:
                del stamped[job_id]

    def claimed(self, rows: Sequence[Mapping[str, Any]], sent: float) -> None:
        """Rows a keyed claim sent at ``sent`` (monotonic) returned."""
        self._forget_old(sent)
        for row in rows:
            count = row["claimed_rate"]
            if count is not None and row["status"] == "running":
                period = float(row["claimed_period"])
                margin = LimitStore.margin(period)
                self.stamped[row["job_id"]] = Stamped(
                    sent + margin, margin, row["claimed_key"], count, period
                )

    def claimed_limited(self, rows: Sequence[Mapping[str, Any]], sent: float) -> None:
        """Rows a limited claim sent at ``sent`` (monotonic) returned."""
        if not rows or rows[0]["limit_margin"] is None:
            return  # no rate bound this claim
        self._forget_old(sent)
        for row in rows:
            if row["status"] == "running":
                margin = float(row["limit_margin"])
                self.stamped[row["job_id"]] = Stamped(
                    sent + margin,
                    margin,
                    task=row["task_name"],
                    queue=row["queue"],
                    stamp=row["limit_stamp"],
                )

    def take(self, job_id: str) -> Stamped | None:
        """The claim's record of a job about to start (None: no rate binds it)."""
        return self.stamped.pop(job_id, None)

    async def again(self, entry: Stamped, job_id: str, attempt: int) -> bool | None:
        """Stamp the start again now (see :meth:`KeyStore.restamp
        <pg_scheduler.store.keys.KeyStore.restamp>` and :meth:`LimitStore.restamp
        <pg_scheduler.store.limits.LimitStore.restamp>`)."""
        store = self.store
        async with store.pool.acquire() as conn:
            if entry.key is not None:
                return await store.keys.restamp(
                    conn,
                    key=entry.key,
                    job_id=job_id,
                    worker_id=self.worker_id,
                    attempt=attempt,
                    most=entry.most,
                    period=entry.period,
                )
            assert entry.stamp is not None
            return await store.limits.restamp(
                conn,
                job_id=job_id,
                worker_id=self.worker_id,
                attempt=attempt,
                task=entry.task,
                queue=entry.queue,
                stamp=entry.stamp,
            )

    async def admit(self, entry: Stamped, job_id: str, attempt: int) -> bool | None:
        """Called on the loop just before the job's function starts: True to
        run it now; False: the window is full (its stamp dropped: hand it
        back); None: the job is no longer this attempt's."""
        deadline = entry.deadline
        while time.monotonic() > deadline:
            sent = time.monotonic()
            moved = await self.again(entry, job_id, attempt)
            if not moved:
                return moved
            deadline = sent + entry.margin
        return True

    def admit_in_thread(
        self, entry: Stamped, job_id: str, attempt: int, loop: asyncio.AbstractEventLoop
    ) -> bool | None:
        """:meth:`admit` from the thread that starts a thread job's function
        (or sends a process job its arguments) right after: the stamp is
        moved on the loop, the thread waits. A stamp that cannot be moved
        (the loop or the database does not answer in ``THREAD_WAIT`` s):
        False."""
        deadline = entry.deadline
        while time.monotonic() > deadline:
            sent = time.monotonic()
            try:
                moved = asyncio.run_coroutine_threadsafe(
                    self.again(entry, job_id, attempt), loop
                ).result(THREAD_WAIT)
            except Exception:
                return False
            if not moved:
                return moved
            deadline = sent + entry.margin
        return True
