"""Typed views of stored rows returned by the public API."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from .config import RetryPolicy
from .enums import JobPriority, JobStatus
from .limits import RateLimit
from .support.codec import decode_json, decode_task_data


class Attempt(BaseModel):
    """One attempt at a job. ``outcome`` is completed, failed, timed_out,
    cancelled, rescued or handed_back; None while it runs."""

    model_config = ConfigDict(frozen=True)

    attempt: int
    worker_id: str | None
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str | None
    error: str | None = None
    traceback: str | None = None


def _attempt_history(row: Any, status: JobStatus) -> list[Attempt]:
    # Attempts that did not complete are in job_attempts; the running or
    # completed one is the job row itself (migration 0006).
    history = [Attempt(**a) for a in decode_json(row.get("attempt_history")) or ()]
    if status in (JobStatus.RUNNING, JobStatus.COMPLETED) and row["attempts"]:
        history.append(
            Attempt(
                attempt=row["attempts"],
                worker_id=row["worker_id"],
                started_at=row["started_at"],
                finished_at=row["finished_at"],
                outcome="completed" if status is JobStatus.COMPLETED else None,
            )
        )
    return history


def _rate(count: int | None, period: float | None) -> str | None:
    """A key's stored rate as written (``"5/s"``), or None."""
    if count is None or period is None:
        return None
    return str(RateLimit(count, period))


def _waiting(row: Any) -> dict[str, Any]:
    return {
        "wait_kind": row.get("wait_kind"),
        "wait_for": row.get("wait_for"),
        "wake_at": row.get("wake_at"),
    }


class Job(BaseModel):
    """One job as stored, returned by :meth:`Scheduler.get_job`."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    job_name: str
    task_name: str
    status: JobStatus
    priority: JobPriority
    execution_time: datetime
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    last_heartbeat: datetime | None
    lease_until: datetime | None
    attempts: int
    retry_count: int
    max_retries: int
    rescue_count: int
    worker_id: str | None
    misfire_grace_time: int | None
    timeout: float | None
    args: list[Any]
    kwargs: dict[str, Any]
    result: Any
    error: str | None
    traceback: str | None
    retry_policy: RetryPolicy | None
    #: When a pending job that failed before will be tried again.
    next_retry_at: datetime | None
    #: Nominal delays (seconds, before jitter) of the retries still allowed.
    planned_retry_delays: list[float]
    #: Every attempt, oldest first (``attempts`` is their count, as in 0.2.x).
    attempt_history: list[Attempt] = []
    #: The latest progress the job reported (current_job().report_progress() or set_progress()).
    progress: float | None = None
    progress_message: str | None = None
    progress_at: datetime | None = None
    #: The job's dedupe key and its scope ("active" or "pending"; "debounce" or
    #: "throttle" for a debounced or throttled job), or None.
    dedupe_key: str | None = None
    dedupe_scope: str | None = None
    #: A parked workflow (status ``waiting``): what it waits for ("sleep",
    #: "signal" or "children"), the signal's name, and the latest time it
    #: wakes (a sleep's end, a wait's timeout, its deadline). None otherwise.
    wait_kind: str | None = None
    wait_for: str | None = None
    wake_at: datetime | None = None
    #: The workflow that spawned this job (``ctx.spawn``), or None.
    parent_job_id: str | None = None
    #: Its concurrency key and per-key limits (docs/keys.md): at most
    #: ``max_running_per_key`` of the key's jobs run at once, at most
    #: ``rate_limit_per_key`` start per window (``"5/s"``), ``ordered``: one
    #: at a time in enqueue order. None / False without a key.
    concurrency_key: str | None = None
    max_running_per_key: int | None = None
    rate_limit_per_key: str | None = None
    ordered: bool = False
    #: Its fair share key and weight (docs/fair-share.md), or None.
    fair_share_key: str | None = None
    fair_share_weight: float | None = None
    #: A batch task's job: the batch its latest batch attempt ran in (one id
    #: per call of the handler) and how many jobs that call was given. None
    #: for a job that never ran in a batch.
    batch_id: str | None = None
    batch_size: int | None = None

    @classmethod
    def from_record(cls, row: Any, default_retry: RetryPolicy) -> Job:
        args, kwargs = decode_task_data(row["task_data"])
        stored_policy = decode_json(row["retry_policy"])
        policy = RetryPolicy.from_stored(stored_policy) if stored_policy else None
        effective = policy or default_retry
        remaining = range(row["retry_count"] + 1, row["max_retries"] + 1)
        status = JobStatus(row["status"])
        return cls(
            job_id=row["job_id"],
            job_name=row["job_name"],
            task_name=row["task_name"],
            status=status,
            priority=JobPriority.from_db_value(row["priority"]),
            execution_time=row["execution_time"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            last_heartbeat=row["last_heartbeat"],
            lease_until=row["lease_until"],
            attempts=row["attempts"],
            retry_count=row["retry_count"],
            max_retries=row["max_retries"],
            rescue_count=row["rescue_count"],
            worker_id=row["worker_id"],
            misfire_grace_time=row["misfire_grace_time"],
            timeout=row["timeout"],
            args=args,
            kwargs=kwargs,
            result=decode_json(row["result"]),
            error=row["error_message"],
            traceback=row["error_traceback"],
            retry_policy=policy,
            next_retry_at=(
                row["execution_time"]
                if status is JobStatus.PENDING and row["retry_count"] > 0
                else None
            ),
            planned_retry_delays=[effective.nominal_delay(n) for n in remaining],
            attempt_history=_attempt_history(row, status),
            progress=row.get("progress"),
            progress_message=row.get("progress_message"),
            progress_at=row.get("progress_at"),
            dedupe_key=row.get("dedupe_key"),
            dedupe_scope=row.get("dedupe_scope"),
            parent_job_id=row.get("parent_job_id"),
            concurrency_key=row.get("concurrency_key"),
            max_running_per_key=row.get("max_running_per_key"),
            rate_limit_per_key=_rate(row.get("rate_count_per_key"), row.get("rate_period_per_key")),
            ordered=bool(row.get("key_ordered")),
            fair_share_key=row.get("fair_share_key"),
            fair_share_weight=row.get("fair_share_weight"),
            batch_id=row.get("batch_id"),
            batch_size=row.get("batch_size"),
            **(_waiting(row) if status is JobStatus.WAITING else {}),
        )


class TaskInventory(BaseModel):
    """What :meth:`Scheduler.load_task_functions` reports."""

    #: Task names this process can run.
    registered: list[str]
    #: Due pending jobs, by task name, that no live worker has registered.
    unknown: dict[str, int]
    #: Each periodic job's runner task here (``periodic:<dedup key>``) -> its job name.
    periodic: dict[str, str] = {}
    #: Each batch task here (``@task(batch_size=...)``) -> its batch size.
    batches: dict[str, int] = {}
