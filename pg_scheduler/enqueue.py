"""Turning schedule() calls into validated rows, and writing them per conflict policy.

Everything is checked and serialized before anything is written, so bad
input raises at the call and writes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from .codec import encode_json, encode_task_data
from .config import UNSET, JobSpec, RetryPolicy
from .enums import ConflictResolution, JobPriority
from .reconnect import retry_on_disconnect
from .store import NewJob, Store
from .tasks import TaskRegistry, ensure_async, task_name_of
from .timeutil import to_aware
from .validation import check_int, check_seconds

# schedule_bulk batches at least this large are written with COPY (generated ids only).
COPY_THRESHOLD = 100


def new_job_id() -> str:
    """A random (version 4) UUID as text, the format 0.2.x's ``gen_random_uuid()`` gave.

    Formatted by hand: ``str(uuid.uuid4())`` costs several microseconds, which
    shows in bulk enqueues of a hundred thousand jobs.
    """
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


def check_conflict_resolution(value: Any) -> None:
    if not isinstance(value, ConflictResolution):
        raise TypeError(f"conflict_resolution must be a ConflictResolution, got {value!r}")


class Enqueuer:
    """Builds rows for one Scheduler (its registry and defaults) and inserts them."""

    def __init__(
        self,
        store: Store,
        pool: asyncpg.Pool,
        registry: TaskRegistry,
        default_misfire_grace_time: Callable[[], int | None],
    ) -> None:
        self.store = store
        self.pool = pool
        self.registry = registry
        self.default_misfire_grace_time = default_misfire_grace_time

    def build(
        self,
        func: Callable[..., Any],
        execution_time: Any,
        args: Any,
        kwargs: Any,
        priority: Any,
        max_retries: Any,
        job_id: Any,
        misfire_grace_time: Any,
        timeout: Any,
        retry_policy: Any,
        known: dict[Any, str] | None = None,
    ) -> NewJob:
        """A row for ``func(*args, **kwargs)``; registers ``func`` so this worker runs it.

        ``known``: functions already checked and registered in this bulk call.
        """
        task_name = known.get(func) if known is not None else None
        if task_name is None:
            ensure_async(func)
            self.registry.register(func)
            task_name = task_name_of(func)
            if known is not None:
                known[func] = task_name
        return self.row(
            func.__name__,
            task_name,
            execution_time,
            encode_task_data(args, {} if kwargs is None else kwargs, task_name),
            priority,
            max_retries,
            job_id,
            misfire_grace_time,
            timeout,
            retry_policy,
        )

    def row(
        self,
        job_name: str,
        task_name: str,
        execution_time: Any,
        task_data: str,
        priority: Any,
        max_retries: Any,
        job_id: Any,
        misfire_grace_time: Any,
        timeout: Any,
        retry_policy: Any,
    ) -> NewJob:
        """Validate the remaining fields; ``misfire_grace_time=UNSET`` takes the default."""
        if not isinstance(execution_time, datetime):
            raise TypeError(f"execution_time must be a datetime, got {execution_time!r}")
        if not isinstance(priority, JobPriority):
            raise TypeError(f"priority must be a JobPriority, got {priority!r}")
        check_int("max_retries", max_retries, 0)
        if job_id is not None and (not isinstance(job_id, str) or not job_id.strip()):
            raise ValueError(f"job_id must be a non-empty string or None, got {job_id!r}")
        if misfire_grace_time is UNSET:
            misfire_grace_time = self.default_misfire_grace_time()
        check_int("misfire_grace_time", misfire_grace_time, 0, allow_none=True)
        check_seconds("timeout", timeout)
        if retry_policy is not None and not isinstance(retry_policy, RetryPolicy):
            raise TypeError(f"retry_policy must be a RetryPolicy, got {retry_policy!r}")
        return NewJob(
            job_id=job_id or new_job_id(),
            job_name=job_name,
            task_name=task_name,
            execution_time=to_aware(execution_time),
            task_data=task_data,
            priority=priority.db_value,
            max_retries=max_retries,
            misfire_grace_time=misfire_grace_time,
            timeout=None if timeout is None else float(timeout),
            retry_policy=None
            if retry_policy is None
            else encode_json(
                {
                    "base_delay": retry_policy.base_delay,
                    "factor": retry_policy.factor,
                    "max_delay": retry_policy.max_delay,
                    "jitter": retry_policy.jitter,
                }
            ),
        )

    async def bulk(
        self,
        jobs: list[JobSpec],
        conflict: ConflictResolution,
        batch_size: int,
        connection: asyncpg.Connection | None,
    ) -> tuple[list[str | None], int]:
        """Write many specs; (ids in input order with None for IGNORE-skipped, rows written)."""
        check_conflict_resolution(conflict)
        check_int("batch_size", batch_size, 1)
        if not isinstance(jobs, Sequence):
            raise TypeError("jobs must be a list of JobSpec")
        rows: list[NewJob] = []
        known: dict[Any, str] = {}
        for index, spec in enumerate(jobs):
            if not isinstance(spec, JobSpec):
                raise TypeError(f"jobs[{index}] must be a JobSpec, got {type(spec).__name__}")
            rows.append(
                self.build(
                    spec.func,
                    spec.execution_time,
                    spec.args,
                    spec.kwargs,
                    spec.priority,
                    spec.max_retries,
                    spec.job_id,
                    spec.misfire_grace_time,
                    spec.timeout,
                    spec.retry_policy,
                    known=known,
                )
            )
        if not rows:
            return [], 0
        seen: set[str] = set()
        duplicates = {r.job_id for r in rows if r.job_id in seen or seen.add(r.job_id)}
        if duplicates and conflict is not ConflictResolution.IGNORE:
            raise ValueError(
                f"job ids repeated within one schedule_bulk call: {sorted(duplicates)[:10]}"
            )
        user_ids = [spec.job_id for spec in jobs if spec.job_id is not None]
        if conflict is ConflictResolution.RAISE and user_ids:
            existing = await self.store.existing_ids(connection or self.pool, user_ids)
            if existing:
                raise ValueError(
                    f"job ids already exist: {sorted(existing)[:10]}; nothing "
                    "was scheduled (use IGNORE or REPLACE to allow this)"
                )
        written: set[str] = set()
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            written |= await self.write(batch, conflict, connection, user_ids=bool(user_ids))
        if conflict is not ConflictResolution.IGNORE:
            return [row.job_id for row in rows], len(written)
        result: list[str | None] = []
        returned: set[str] = set()
        for row in rows:
            fresh = row.job_id in written and row.job_id not in returned
            returned.add(row.job_id)
            result.append(row.job_id if fresh else None)
        return result, len(written)

    async def write(
        self,
        rows: list[NewJob],
        conflict: ConflictResolution,
        connection: asyncpg.Connection | None,
        user_ids: bool,
    ) -> set[str]:
        """Insert per ``conflict``; returns the ids written. RAISE -> ValueError on a duplicate."""
        insert = {
            ConflictResolution.RAISE: self.store.insert,
            ConflictResolution.IGNORE: self.store.insert_ignore,
            ConflictResolution.REPLACE: self.store.insert_replace,
        }[conflict]
        if not user_ids and len(rows) >= COPY_THRESHOLD:
            # Generated ids cannot collide, so no conflict handling is needed: COPY.
            insert = self.store.copy_insert

        async def on(conn: asyncpg.Connection) -> set[str]:
            # A savepoint inside the caller's transaction: a duplicate must not
            # abort the caller's work.
            async with conn.transaction():
                return await insert(conn, rows)

        attempts = 0

        async def attempt() -> set[str]:
            nonlocal attempts
            attempts += 1
            try:
                if connection is not None:
                    return await on(connection)
                # One INSERT statement is atomic on its own: no BEGIN/COMMIT round trips.
                return await insert(self.pool, rows)
            except asyncpg.UniqueViolationError as exc:
                if attempts > 1 and not user_ids:
                    # Our generated ids are unique: the earlier attempt committed
                    # and only its answer was lost.
                    return {r.job_id for r in rows}
                raise ValueError(
                    f"Job ID already exists: {exc.detail or exc}. Choose a different job_id, "
                    "omit it for auto-generation, or use ConflictResolution.IGNORE/REPLACE"
                ) from None

        if connection is not None:
            return await attempt()
        return await retry_on_disconnect(attempt, what="schedule", give_up_after=10)
