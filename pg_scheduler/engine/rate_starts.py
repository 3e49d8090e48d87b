"""Starts of rate-limited keyed jobs: each function starts within the rate
window's margin of its stamp.

The keyed claim stamps a start for each rate-limited job it takes
(``scheduler_key_starts``, the database's clock as the statement runs) and
counts the key's starts over the period plus a margin
(:meth:`KeyStore.margin <pg_scheduler.store.keys.KeyStore.margin>`). That
holds the functions' starts to the rate, as the functions' own clocks time
them, as long as each function starts within the margin after its stamp:
then the functions that start in any span of one period have their stamps
within one period plus the margin, and the claims keep such a span to the
rate's count.

The stamp comes after the claim was sent, so the worker bounds the gap on its
own monotonic clock: a job whose function would start later than the margin
after its claim was sent (the loop was busy, the row waited for a slot) is
stamped again first, under its key's lock: its old stamp goes, and a new one
is written now if the key's other starts in the window leave room. With no
room the job is handed back to pending (its attempt not spent) and a later
claim takes it when the window has room. Either way no start is ever counted
earlier than the function's own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, NamedTuple

from ..store.keys import KeyStore

#: Entries of rows that never started here are dropped FORGET_AFTER seconds
#: past their deadline, once more than FORGET_PAST are kept.
FORGET_PAST = 1_000
FORGET_AFTER = 300.0
#: Seconds a thread waits for the loop to move a stamp.
THREAD_WAIT = 10.0


class Stamped(NamedTuple):
    #: Monotonic time by which the function must start (claim sent + margin).
    deadline: float
    key: str
    most: int
    period: float


#: Runs ``KeyStore.restamp`` on a connection: (key, job_id, attempt, most, period).
Restamp = Callable[[str, str, int, int, float], Coroutine[Any, Any, "bool | None"]]


class RateStarts:
    """The claim's send time of each rate-limited keyed job not started yet."""

    def __init__(self) -> None:
        self.stamped: dict[str, Stamped] = {}

    def claimed(self, rows: Sequence[Mapping[str, Any]], sent: float) -> None:
        """Rows a keyed claim sent at ``sent`` (monotonic) returned."""
        stamped = self.stamped
        if len(stamped) > FORGET_PAST:
            # Rows handed back unstarted (a paused queue, the buffer) leave
            # their entry: drop those long past their deadline.
            old = sent - FORGET_AFTER
            for job_id in [j for j, e in stamped.items() if e.deadline < old]:
                del stamped[job_id]
        for row in rows:
            count = row["claimed_rate"]
            if count is not None and row["status"] == "running":
                period = float(row["claimed_period"])
                stamped[row["job_id"]] = Stamped(
                    sent + KeyStore.margin(period), row["claimed_key"], count, period
                )

    def take(self, job_id: str) -> Stamped | None:
        """The claim's record of a job about to start (None: no rate binds it)."""
        return self.stamped.pop(job_id, None)

    @staticmethod
    async def admit(entry: Stamped, job_id: str, attempt: int, restamp: Restamp) -> bool | None:
        """Called on the loop just before the job's function starts: True to
        run it now; False: the window is full (its stamp dropped: hand it
        back); None: the job is no longer this attempt's."""
        deadline = entry.deadline
        while time.monotonic() > deadline:
            sent = time.monotonic()
            moved = await restamp(entry.key, job_id, attempt, entry.most, entry.period)
            if not moved:
                return moved
            deadline = sent + KeyStore.margin(entry.period)
        return True

    @staticmethod
    def admit_in_thread(
        entry: Stamped,
        job_id: str,
        attempt: int,
        restamp: Restamp,
        loop: asyncio.AbstractEventLoop,
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
                    restamp(entry.key, job_id, attempt, entry.most, entry.period), loop
                ).result(THREAD_WAIT)
            except Exception:
                return False
            if not moved:
                return moved
            deadline = sent + KeyStore.margin(entry.period)
        return True
