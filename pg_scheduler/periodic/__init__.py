"""Periodic jobs: ``@periodic`` and its registry, one Scheduler's runtime, the
enqueuer service, window planning and cron.

``registry``: the decorator, :class:`PeriodicJobConfig`, the process-wide
registry. ``runtime``: one Scheduler's side (enable/disable, triggers, running a
window). ``enqueuer``: the background service that writes due windows.
``windows``: interval schedules and what to run after an outage. ``cron``: cron
expressions with the DST rule. ``pg_scheduler.periodic`` is the 0.2.x import path.
"""

from .cron import CronError, CronSchedule
from .registry import (
    PeriodicJobConfig,
    _registry,
    periodic,
    registered_periodic_job,
    registered_periodic_jobs,
    window_job_id,
)
from .windows import CoalescePolicy, IntervalSchedule, Schedule

__all__ = [
    "CoalescePolicy",
    "CronError",
    "CronSchedule",
    "IntervalSchedule",
    "PeriodicJobConfig",
    "Schedule",
    "_registry",
    "periodic",
    "registered_periodic_job",
    "registered_periodic_jobs",
    "window_job_id",
]
