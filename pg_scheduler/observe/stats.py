"""A snapshot of the queue for operators: :meth:`Scheduler.stats`, the CLI, Prometheus.

Everything comes from the database in one read-only transaction (one
consistent snapshot, one clock), so any process can compute it, including
one that runs no jobs. Rates are derived from the ``finished_at`` of rows
still in the table: rows the vacuum already deleted are not counted, which
is why ``throughput`` is None when completed jobs are deleted on completion.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg
from pydantic import BaseModel, ConfigDict

from ..enums import JobStatus
from ..limits import key_record, limit_record
from ..store import QueueStore
from ..store.fair import FairStore
from ..store.housekeeping import StatsStore
from ..store.keys import KeyStore
from ..store.limits import LimitStore
from ..store.names import Qualifier
from ..store.orphans import OrphanStore
from ..store.workflow_views import WorkflowViews

#: The default windows for throughput and failure rate: 1 minute, 5 minutes, 1 hour.
DEFAULT_WINDOWS: tuple[float, ...] = (60.0, 300.0, 3600.0)


class TaskCounts(BaseModel):
    """Jobs of one task name by status; ``due`` counts the pending ones already due;
    ``waiting``: parked workflows (sleeping, waiting for a signal or children)."""

    model_config = ConfigDict(frozen=True)

    task_name: str
    pending: int = 0
    due: int = 0
    running: int = 0
    waiting: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0


class QueueCounts(BaseModel):
    """One queue: its pending (``due`` of them already due), running and waiting
    (parked workflows) jobs, and whether it is paused."""

    model_config = ConfigDict(frozen=True)

    queue: str
    paused: bool = False
    pending: int = 0
    due: int = 0
    running: int = 0
    waiting: int = 0


class WindowStats(BaseModel):
    """Jobs that finished within the last ``seconds``."""

    model_config = ConfigDict(frozen=True)

    seconds: float
    completed: int
    failed: int
    cancelled: int
    expired: int
    #: Completed jobs per second; None when completed rows are deleted at once.
    throughput: float | None
    #: failed / (completed + failed); None when nothing finished (or completed
    #: rows are deleted at once, so the denominator is unknown).
    failure_rate: float | None


class WorkerStats(BaseModel):
    """One row of ``scheduler_workers`` with the jobs it holds now."""

    model_config = ConfigDict(frozen=True)

    worker_id: str
    hostname: str
    pid: int
    started_at: datetime
    last_seen: datetime
    seen_seconds_ago: float
    max_concurrent: int
    running: int
    tasks: list[str]
    #: Heartbeat within the threshold: the worker is considered alive.
    alive: bool


class LimitStats(BaseModel):
    """One global limit (docs: Queues, limits and dedupe keys) and how close it is."""

    model_config = ConfigDict(frozen=True)

    scope: str  # "task" or "queue"
    name: str
    max_running: int | None
    rate_limit: str | None  # "100/m"
    running: int
    #: Starts in the current rolling window (None without a rate limit).
    started_in_window: int | None


class KeyStats(BaseModel):
    """One concurrency key (docs/keys.md) among the busiest: what runs and waits."""

    model_config = ConfigDict(frozen=True)

    key: str
    running: int
    waiting: int
    max_running_per_key: int | None
    rate_limit_per_key: str | None  # "10/s"
    #: Starts in the current rate window (None without a rate limit).
    started_in_window: int | None
    ordered: bool


class FairShareStats(BaseModel):
    """One fair share key (docs/fair-share.md) among the busiest: its backlog,
    what runs, and its part of the recent starts."""

    model_config = ConfigDict(frozen=True)

    key: str
    #: Pending jobs, and those of them already due.
    waiting: int
    due: int
    running: int
    #: Starts over the last few seconds, decayed (the fair claim's own record).
    recent_starts: float
    #: ``recent_starts`` over every listed key's: 0 to 1.
    share: float
    #: The weight set per key (``set_fair_share_weight``); None: its jobs' own.
    weight: float | None


def fair_share_stats(rows: Sequence[Any]) -> list[FairShareStats]:
    """The busiest fair share keys (store/fair.py), each with its share of the starts."""
    total = sum(float(r["recent_starts"]) for r in rows)
    return [
        FairShareStats(
            key=r["fair_share_key"],
            waiting=r["waiting"],
            due=r["due"],
            running=r["running"],
            recent_starts=float(r["recent_starts"]),
            share=float(r["recent_starts"]) / total if total > 0 else 0.0,
            weight=r["weight"],
        )
        for r in rows
    ]


class OrphanedJobCounts(BaseModel):
    """Due jobs of one task in one queue that no live worker has registered:
    they wait until a worker with that task runs (``pg-scheduler orphans``)."""

    model_config = ConfigDict(frozen=True)

    task_name: str
    queue: str
    due: int
    oldest_due: datetime
    #: The periodic job's name when these are its windows, else None.
    periodic_name: str | None = None


class OrphanedPeriodicJob(BaseModel):
    """A stored periodic job no live process declares: none of its windows is
    enqueued or run until one does (``pg-scheduler orphans``)."""

    model_config = ConfigDict(frozen=True)

    dedup_key: str
    job_name: str
    task_name: str
    schedule: str
    enabled: bool
    next_run: datetime | None
    #: Its windows waiting in the table (due or not).
    pending: int


class QueueStats(BaseModel):
    """What :meth:`Scheduler.stats` returns."""

    model_config = ConfigDict(frozen=True)

    #: The database's clock when the snapshot was taken.
    taken_at: datetime
    #: Every status -> number of rows (statuses with no rows are 0).
    counts: dict[str, int]
    #: Pending jobs already due (waiting for a worker), across all tasks.
    due: int
    #: Pending jobs due in the future.
    scheduled: int
    by_task: list[TaskCounts]
    #: Every queue with pending, running or waiting jobs, or a stored setting (paused).
    by_queue: list[QueueCounts] = []
    #: worker_id -> running jobs (including workers no longer alive).
    running_by_worker: dict[str, int]
    #: Seconds the longest-waiting due job has been due; None when nothing is due.
    oldest_pending_age: float | None
    windows: list[WindowStats]
    workers: list[WorkerStats]
    live_workers: int
    #: True when completed rows are deleted on completion (no completed counts).
    completed_deleted: bool
    #: Global limits per task and queue.
    limits: list[LimitStats] = []
    #: The busiest concurrency keys (running, then waiting), at most BUSIEST_KEYS.
    keys: list[KeyStats] = []
    #: The busiest fair share keys (running plus recent starts, then waiting), at most BUSIEST_KEYS.
    fair_share: list[FairShareStats] = []
    #: Due jobs whose task no live worker has registered.
    orphaned_jobs: list[OrphanedJobCounts] = []
    #: Stored periodic jobs no live process declares.
    orphaned_periodic: list[OrphanedPeriodicJob] = []
    #: Each stored periodic job's task name (``periodic:<dedup key>``) -> its name.
    periodic_names: dict[str, str] = {}

    def label(self, task_name: str) -> str:
        """``task_name`` as people read it: a periodic job's name beside its key."""
        return task_label(task_name, self.periodic_names)

    def window(self, seconds: float) -> WindowStats | None:
        """The window of exactly ``seconds``, if it was computed."""
        return next((w for w in self.windows if w.seconds == seconds), None)


def task_label(task_name: str, periodic_names: dict[str, str]) -> str:
    """A periodic job's runner task (``periodic:f27ac4c8cbdeb614``) shown with the
    periodic job's name first (``periodic_cleanup (periodic:f27ac4c8cbdeb614)``);
    any other task name as it is."""
    name = periodic_names.get(task_name)
    return task_name if name is None else f"{name} ({task_name})"


#: How many concurrency keys, and fair share keys, the statistics list.
BUSIEST_KEYS = 10


async def collect_stats(
    pool: asyncpg.Pool,
    *,
    heartbeat_threshold: float = 120.0,
    windows: Sequence[float] = DEFAULT_WINDOWS,
    completed_deleted: bool = False,
    schema: str = "public",
) -> QueueStats:
    """Read a consistent snapshot of the queue (a few index-driven queries and one
    pass over the table for the per-task counts)."""
    if not windows or any(w <= 0 for w in windows):
        raise ValueError(f"windows must be positive numbers of seconds, got {windows!r}")
    store = StatsStore(pool, schema)
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        taken_at = await StatsStore.now(conn)
        count_rows = await store.counts(conn)
        running_rows = await store.running_by_worker(conn)
        oldest = await store.oldest_due_seconds(conn)
        queue_rows = await QueueStore(pool, schema).queues(conn)
        waiting_by_queue = await WorkflowViews(pool, schema).waiting_by_queue(conn)
        window_rows = await store.finished_in_windows(conn, windows)
        worker_rows = await store.workers(conn)
        limit_rows = await LimitStore(pool, Qualifier(schema)).listing(conn)
        key_rows = await KeyStore(Qualifier(schema)).busiest(conn, BUSIEST_KEYS)
        fair_rows = await FairStore(pool, Qualifier(schema)).busiest(BUSIEST_KEYS, conn)
        orphan_store = OrphanStore(pool, schema)
        orphans = await orphan_store.read(heartbeat_threshold, db=conn)
        periodic_names = await orphan_store.periodic_names(conn)

    counts = {status.value: 0 for status in JobStatus}
    tasks: dict[str, dict[str, Any]] = {}
    due = 0
    for row in count_rows:
        counts[row["status"]] = counts.get(row["status"], 0) + row["n"]
        entry = tasks.setdefault(row["task_name"], {"task_name": row["task_name"]})
        entry[row["status"]] = row["n"]
        if row["status"] == JobStatus.PENDING:
            entry["due"] = row["due"]
            due += row["due"]

    running_by_worker = {r["worker_id"]: r["n"] for r in running_rows if r["worker_id"]}

    finished: dict[float, dict[str, int]] = {float(w): {} for w in windows}
    for row in window_rows:
        finished[float(row["secs"])][row["status"]] = row["n"]
    window_stats = []
    for seconds, by_status in finished.items():
        completed = by_status.get("completed", 0)
        failed = by_status.get("failed", 0)
        window_stats.append(
            WindowStats(
                seconds=seconds,
                completed=completed,
                failed=failed,
                cancelled=by_status.get("cancelled", 0),
                expired=by_status.get("expired", 0),
                throughput=None if completed_deleted else completed / seconds,
                failure_rate=(
                    None
                    if completed_deleted or completed + failed == 0
                    else failed / (completed + failed)
                ),
            )
        )

    workers = [
        WorkerStats(
            worker_id=r["worker_id"],
            hostname=r["hostname"],
            pid=r["pid"],
            started_at=r["started_at"],
            last_seen=r["last_seen"],
            seen_seconds_ago=max(0.0, r["seen_seconds_ago"]),
            max_concurrent=r["max_concurrent"],
            running=running_by_worker.get(r["worker_id"], 0),
            tasks=list(r["tasks"]),
            alive=r["seen_seconds_ago"] <= heartbeat_threshold,
        )
        for r in worker_rows
    ]
    by_queue = {
        r["name"]: QueueCounts(
            queue=r["name"],
            paused=r["paused"],
            pending=r["pending"],
            due=r["due"],
            running=r["running"],
            waiting=waiting_by_queue.get(r["name"], 0),
        )
        for r in queue_rows
    }
    # A queue whose only jobs are parked workflows: after the others.
    for name, n in sorted(waiting_by_queue.items()):
        by_queue.setdefault(name, QueueCounts(queue=name, waiting=n))
    return QueueStats(
        taken_at=taken_at,
        counts=counts,
        by_queue=list(by_queue.values()),
        due=due,
        scheduled=counts[JobStatus.PENDING] - due,
        by_task=[TaskCounts(**t) for _, t in sorted(tasks.items())],
        running_by_worker=running_by_worker,
        oldest_pending_age=None if oldest is None else max(0.0, oldest),
        windows=window_stats,
        workers=workers,
        live_workers=sum(1 for w in workers if w.alive),
        completed_deleted=completed_deleted,
        limits=[LimitStats(**limit_record(r)) for r in limit_rows],
        keys=[KeyStats(**key_record(r)) for r in key_rows],
        fair_share=fair_share_stats(fair_rows),
        orphaned_jobs=[OrphanedJobCounts(**o._asdict()) for o in orphans.jobs],
        orphaned_periodic=[OrphanedPeriodicJob(**o._asdict()) for o in orphans.periodic],
        periodic_names=periodic_names,
    )
