"""Fire times and window planning for periodic jobs: pure functions, no I/O.

:class:`IntervalSchedule` aligns windows to the Unix epoch so every replica
computes the same ones; :func:`plan_windows` decides, from the shared cursor
and the database clock, which windows one enqueue pass writes (misfire grace
time and coalesce policy); :func:`coalesced_reason` applies the policy again
when a window's run starts late.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from .cron import CronSchedule

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)
#: At most this many catch-up windows are enqueued per pass with coalesce="all".
CATCH_UP_BATCH = 1000


class CoalescePolicy(StrEnum):
    """Which of several overdue windows run when the enqueuer falls behind
    (every replica was down, or workers left windows pending)."""

    #: Only the most recent overdue window runs (the default).
    LATEST = "latest"
    #: Only the oldest overdue window still within the misfire grace time runs.
    EARLIEST = "earliest"
    #: Every overdue window within the misfire grace time runs.
    ALL = "all"


class IntervalSchedule:
    """Fire times ``EPOCH + k * every``: fixed, so every replica agrees on them."""

    def __init__(self, every: timedelta) -> None:
        self.every = every
        self._step = every // MICROSECOND

    def __repr__(self) -> str:
        return f"IntervalSchedule({self.every!r})"

    def next_after(self, after: datetime) -> datetime:
        elapsed = (after - EPOCH) // MICROSECOND
        return EPOCH + (elapsed // self._step + 1) * self._step * MICROSECOND

    def describe(self) -> str:
        seconds = self._step / 1_000_000
        return f"every {seconds:.6f}".rstrip("0").rstrip(".") + "s"


Schedule = IntervalSchedule | CronSchedule


def latest_fire_at_or_before(schedule: Schedule, moment: datetime, floor: datetime) -> datetime:
    """The last fire time in ``[floor, moment]``; ``floor`` must itself be one."""
    span = timedelta(seconds=1)
    while True:
        start = max(floor, moment - span)
        found = floor if start == floor else schedule.next_after(start - MICROSECOND)
        if found is not None and found <= moment:
            while (following := schedule.next_after(found)) is not None and following <= moment:
                found = following
            return found
        span *= 2


@dataclass(frozen=True)
class WindowPlan:
    """What one enqueue pass does for one job."""

    #: Windows already due (at or before now) to enqueue, after the misfire
    #: grace time and the coalesce policy; oldest first.
    due: list[datetime]
    #: Windows not due yet but within the lookahead, enqueued ahead of time.
    upcoming: list[datetime]
    #: The new cursor: the first window not enqueued (None: the schedule ended).
    next_run: datetime | None
    #: (first, last) due window when more than the one on time was due (the
    #: enqueuer fell behind), for the log; None in the normal case.
    overdue: tuple[datetime, datetime] | None = None

    @property
    def run(self) -> list[datetime]:
        """Every window to enqueue in this pass."""
        return self.due + self.upcoming


def plan_windows(
    schedule: Schedule,
    cursor: datetime | None,
    now: datetime,
    grace: float | None,
    policy: CoalescePolicy,
    lookahead: float = 0.0,
    limit: int = CATCH_UP_BATCH,
) -> WindowPlan:
    """Decide which windows to enqueue, given the cursor and the database clock.

    Windows from ``cursor`` up to ``now`` are due. Those older than
    ``now - grace`` are misfired and dropped; of the rest, ``policy`` keeps the
    latest, the earliest or all. Windows up to ``now + lookahead`` are enqueued
    ahead so that workers start them on time. A ``None`` cursor (new or
    re-enabled job) starts at the first window after ``now``.
    """
    due: list[datetime] = []
    overdue: tuple[datetime, datetime] | None = None
    if cursor is None:
        following = schedule.next_after(now)
    elif cursor > now:
        following = cursor
    else:
        first: datetime | None = cursor
        if grace is not None and cursor < now - timedelta(seconds=grace):
            first = schedule.next_after(now - timedelta(seconds=grace) - MICROSECOND)
        following = schedule.next_after(now)
        if first is not None and first <= now:
            if policy is CoalescePolicy.EARLIEST:
                due = [first]
            elif policy is CoalescePolicy.LATEST:
                due = [latest_fire_at_or_before(schedule, now, first)]
            else:
                due = [first]
                while (nxt := schedule.next_after(due[-1])) is not None and nxt <= now:
                    if len(due) == limit:  # the rest in the next pass
                        return WindowPlan(due, [], nxt, (cursor, now))
                    due.append(nxt)
        last_due = due[-1] if policy is CoalescePolicy.LATEST and due else None
        last_due = last_due or latest_fire_at_or_before(schedule, now, cursor)
        if last_due != cursor or not due:
            overdue = (cursor, last_due)
    upcoming: list[datetime] = []
    horizon = now + timedelta(seconds=lookahead)
    while following is not None and following <= horizon and len(upcoming) < limit:
        upcoming.append(following)
        following = schedule.next_after(following)
    return WindowPlan(due, upcoming, following, overdue)


def coalesced_reason(
    schedule: Schedule,
    policy: CoalescePolicy,
    window: datetime,
    now: datetime,
    last_window: datetime | None,
    last_run: datetime | None,
) -> str | None:
    """Why the run of ``window`` starting ``now`` must not run the job body, or None.

    The enqueuer coalesces the windows it finds overdue, but a window already
    enqueued may start late too (every replica was down, workers were busy), so
    its run applies the policy again: under ``latest`` it yields if the next
    window has come; under ``earliest`` if an older window (the run before this
    one, ``last_window``) started at or after this window's time, i.e. is
    serving the same backlog.
    """
    if policy is CoalescePolicy.LATEST:
        following = schedule.next_after(window)
        if following is not None and following <= now:
            return (
                f"coalesced: the next window ({following.isoformat()}) had already come "
                "(coalesce='latest')"
            )
    elif policy is CoalescePolicy.EARLIEST:
        if last_window is not None and last_run is not None and last_window < window <= last_run:
            return (
                f"coalesced: the earlier overdue window {last_window.isoformat()} ran at "
                f"{last_run.isoformat()} (coalesce='earliest')"
            )
    return None
