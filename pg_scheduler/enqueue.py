"""Turning schedule() calls into validated rows, and writing them per conflict policy.

Everything is checked and serialized before anything is written, so bad
input raises at the call and writes nothing.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from .codec import encode_retry_policy, encode_task_data
from .config import UNSET, RetryPolicy
from .enums import ConflictResolution, JobPriority
from .job_spec import JobSpec
from .reconnect import is_connection_error, retry_on_disconnect
from .store import NewJob, Store
from .tasks import TaskRegistry, ensure_async, task_name_of
from .timeutil import to_aware
from .validation import check_int, check_job_fields

if TYPE_CHECKING:
    from .worker import Worker

# schedule_bulk batches at least this large are written with COPY (generated ids only).
COPY_THRESHOLD = 100
# Generated-id batches written at once, each on its own pooled connection.
WRITE_LANES = 2


# The variant nibble of an RFC 9562 UUID is 8, 9, a or b: two random bits.
_VARIANT = dict(zip("0123456789abcdef", "89ab" * 4, strict=True))
_PRIORITY_DB_VALUES = {p: p.db_value for p in JobPriority}


def new_job_ids(count: int) -> list[str]:
    """``count`` time-ordered (version 7) UUIDs as text: a millisecond clock,
    then 74 random bits.

    Time-ordered because ``job_id`` is the primary key: new ids land at the
    right edge of its index instead of on random pages, which cut the WAL a
    bulk insert writes per row from about 1,450 bytes to 390 and its server
    time by a quarter. Formatted by hand from one read of ``os.urandom``;
    ``uuid`` objects cost several microseconds each.
    """
    clock = f"{time.time_ns() // 1_000_000:012x}"
    prefix = f"{clock[:8]}-{clock[8:]}-7"
    h = os.urandom(10 * count).hex()
    return [
        f"{prefix}{h[i : i + 3]}-{_VARIANT[h[i + 3]]}{h[i + 4 : i + 7]}-{h[i + 7 : i + 19]}"
        for i in range(0, 20 * count, 20)
    ]


def new_job_id() -> str:
    return new_job_ids(1)[0]


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
    ) -> NewJob:
        """A row for ``func(*args, **kwargs)``; registers ``func`` so this worker runs it."""
        task_name = self._register(func)
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
        check_job_fields(
            execution_time, priority, max_retries, job_id, misfire_grace_time, timeout, retry_policy
        )
        return self._new_job(
            job_id or new_job_id(),
            job_name,
            task_name,
            to_aware(execution_time),
            task_data,
            priority,
            max_retries,
            misfire_grace_time,
            timeout,
            retry_policy,
        )

    def _register(self, func: Callable[..., Any]) -> str:
        """Check ``func`` and register it so this worker runs it; its task name."""
        ensure_async(func)
        self.registry.register(func)
        return task_name_of(func)

    def _new_job(
        self,
        job_id: str,
        job_name: str,
        task_name: str,
        execution_time: datetime,
        task_data: str,
        priority: JobPriority,
        max_retries: int,
        misfire_grace_time: int | None,
        timeout: float | None,
        retry_policy: RetryPolicy | None,
    ) -> NewJob:
        """The row for values already checked (aware ``execution_time``)."""
        if misfire_grace_time is UNSET:
            misfire_grace_time = self.default_misfire_grace_time()
        return NewJob(
            job_id,
            job_name,
            task_name,
            execution_time,
            task_data,
            _PRIORITY_DB_VALUES[priority],
            max_retries,
            misfire_grace_time,
            None if timeout is None else float(timeout),
            None if retry_policy is None else encode_retry_policy(retry_policy),
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
        # Bulk lists repeat one function and one time: each is looked at once.
        task_names: dict[Any, str] = {}
        fresh_ids = iter(new_job_ids(len(jobs)))
        last_time: Any = None
        aware_time: Any = None
        for index, spec in enumerate(jobs):
            if not isinstance(spec, JobSpec):
                raise TypeError(f"jobs[{index}] must be a JobSpec, got {type(spec).__name__}")
            # Again: a spec may have been changed since it was built.
            check_job_fields(
                spec.execution_time,
                spec.priority,
                spec.max_retries,
                spec.job_id,
                spec.misfire_grace_time,
                spec.timeout,
                spec.retry_policy,
            )
            func = spec.func
            task_name = task_names.get(func)
            if task_name is None:
                task_name = task_names[func] = self._register(func)
            if spec.execution_time is not last_time:
                last_time = spec.execution_time
                aware_time = to_aware(last_time)
            rows.append(
                self._new_job(
                    next(fresh_ids) if spec.job_id is None else spec.job_id,
                    func.__name__,
                    task_name,
                    aware_time,
                    encode_task_data(spec.args, spec.kwargs, task_name),
                    spec.priority,
                    spec.max_retries,
                    spec.misfire_grace_time,
                    spec.timeout,
                    spec.retry_policy,
                )
            )
        if not rows:
            return [], 0
        user_ids = [spec.job_id for spec in jobs if spec.job_id is not None]
        if user_ids:
            await self._check_user_ids(user_ids, conflict, connection)
        batches = [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]
        if connection is None and not user_ids and len(batches) > 1:
            written = await self._write_concurrently(batches, conflict)
        else:
            written = set()
            for batch in batches:
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

    async def _check_user_ids(
        self,
        user_ids: list[str],
        conflict: ConflictResolution,
        connection: asyncpg.Connection | None,
    ) -> None:
        """Before any write: no id twice in one call, and for RAISE none already taken."""
        seen: set[str] = set()
        duplicates = {i for i in user_ids if i in seen or seen.add(i)}
        if duplicates and conflict is not ConflictResolution.IGNORE:
            raise ValueError(
                f"job ids repeated within one schedule_bulk call: {sorted(duplicates)[:10]}"
            )
        if conflict is ConflictResolution.RAISE:
            existing = await self.store.existing_ids(connection or self.pool, user_ids)
            if existing:
                raise ValueError(
                    f"job ids already exist: {sorted(existing)[:10]}; nothing "
                    "was scheduled (use IGNORE or REPLACE to allow this)"
                )

    async def _write_concurrently(
        self, batches: list[list[NewJob]], conflict: ConflictResolution
    ) -> set[str]:
        """Generated-id batches over WRITE_LANES pooled connections at once: the
        server inserts one batch while the next is encoded and sent. Their ids
        cannot collide, so the order batches commit in does not matter."""
        pending = iter(batches)
        written: set[str] = set()

        async def lane() -> None:
            for batch in pending:
                written.update(await self.write(batch, conflict, None, user_ids=False))

        lanes = [asyncio.ensure_future(lane()) for _ in range(min(WRITE_LANES, len(batches)))]
        try:
            await asyncio.gather(*lanes)
        finally:
            for task in lanes:
                task.cancel()
        return written

    async def write_started(self, row: NewJob, worker: Worker) -> bool | None:
        """Write a due row already claimed by ``worker`` (of this process), which
        starts it at once. True: written (started, or pending when the database
        says it is not due yet). False: ``worker`` has no free slot, nothing
        written. None: the connection was lost, the row may or may not be
        written; ``write(..., retried=True)`` settles it (and the heartbeat hands
        back a row that did land)."""
        if not worker.reserve_local_start():
            return False
        claimed = None
        settled = False
        try:
            async with self.pool.acquire() as conn:
                claimed = await self.store.insert_running(
                    conn, row, worker.worker_id, worker.lease_seconds()
                )
                # Started before the connection goes back to the pool: asyncpg
                # resets it on the way, a round trip the job need not wait for.
                settled = True
                worker.finish_local_start(claimed)
        except Exception as exc:
            if not is_connection_error(exc):
                raise
            return None if claimed is None else True
        finally:
            if not settled:
                worker.finish_local_start(None)
        return True

    async def write(
        self,
        rows: list[NewJob],
        conflict: ConflictResolution,
        connection: asyncpg.Connection | None,
        user_ids: bool,
        retried: bool = False,
    ) -> set[str]:
        """Insert per ``conflict``; returns the ids written. RAISE -> ValueError on a duplicate.

        ``retried``: an earlier attempt at these rows lost its answer.
        """
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
                if (attempts > 1 or retried) and not user_ids:
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
