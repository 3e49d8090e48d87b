"""The worker's view of one job: the fields of its claimed row it needs
(:class:`ClaimedJob`) and the state of the job while it runs here
(:class:`RunningJob`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..support.codec import encode_json


@dataclass(slots=True)
class ClaimedJob:
    """The fields of a claimed row the worker needs."""

    job_id: str
    job_name: str
    task_name: str
    task_data: str | None
    attempt: int
    retry_count: int
    max_retries: int
    timeout: float | None
    retry_policy: str | None
    #: Some job depends on this one: its completion may hand dependents over
    #: (engine/hand_off.py).
    has_dependents: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ClaimedJob:
        # Read straight from the row (an asyncpg Record or a dict): copying it
        # into a dict first cost more than the rest of this method.
        get = row.get
        task_data = get("task_data")
        if task_data is not None and not isinstance(task_data, str):
            task_data = encode_json(task_data)
        return cls(
            row["job_id"],
            row["job_name"],
            get("task_name") or row["job_name"],
            task_data,
            get("attempts") or 1,
            get("retry_count") or 0,
            get("max_retries") or 0,
            get("timeout"),
            get("retry_policy"),
            get("has_dependents") or False,
        )


@dataclass(slots=True)
class RunningJob:
    job: ClaimedJob
    task: asyncio.Task[Any]
    claimed_at: float
    cancel_reason: str | None = None
    #: A sync job was told to stop (cancel or timeout): current_job().cancelled().
    stopped: bool = False
    #: A thread job's thread still running after its outcome was recorded.
    linger: Any = None
    #: False for thread and process jobs (the watchdog names only jobs on the loop).
    on_loop: bool = True
    #: Metrics observers' handles (instrument.started), for the deferred settle.
    observed: Any = None
    #: How long the function ran (seconds), once it returned.
    duration: float | None = None
