"""Writing a debounced or throttled job (see ``timing.py`` and the statements
in ``store/timing.py``).

Each call is one statement on the key's unique index (debounce) or on its
period's row (throttle), so calls from any number of processes meet at the
database and make exactly one job per burst or period; a plain ``schedule()``
runs none of this. Inside a caller's transaction every attempt is a
savepoint, rolled back when it wrote nothing, so no row lock outlives an
attempt that gave up the key; the library never commits or rolls back the
caller's transaction.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

import pg_scheduler.observe.instrument as instrument

from ..store import NewJob, Store
from ..store.timing import TimingStore
from ..support.codec import decode_task_data, encode_task_data
from ..support.pool_release import autocommitted
from ..support.reconnect import retry_on_disconnect
from ..support.validation import clip_repr
from ..workflows.decorator import is_workflow
from .arguments import check_arguments
from .timing import THROTTLE_SCOPE, CallArguments, Timing

#: How long a debounced call waits for a key whose job a worker has claimed
#: ahead (in its buffer, about to start or be handed back), in seconds.
CLAIMED_WAIT = 60.0
# Attempts of a throttled call whose period ends while it runs.
THROTTLE_ATTEMPTS = 20


class _Nothing(Exception):
    """An attempt wrote nothing: its savepoint is rolled back."""


class TimedWriter:
    """Writes debounced and throttled rows for one store and pool."""

    def __init__(self, store: Store, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.timing = TimingStore(store.qualify)

    async def write(
        self,
        row: NewJob,
        timing: Timing,
        func: Callable[..., Any],
        args: Any,
        kwargs: Any,
        connection: asyncpg.Connection | None,
    ) -> str:
        """Write ``row`` as ``timing`` says; the id of the burst's or period's job."""
        if timing.kind == THROTTLE_SCOPE:
            return await self._throttle(row, timing.seconds, connection)
        return await self._debounce(row, timing, func, args, kwargs, connection)

    async def _run(
        self,
        connection: asyncpg.Connection | None,
        attempt: Callable[[asyncpg.Connection], Awaitable[str | None]],
        transaction: bool,
    ) -> str | None:
        """One attempt: in a savepoint of the caller's transaction (rolled back
        if it wrote nothing), in a transaction of its own on the pool, or
        (``transaction`` False) one self-committing statement."""
        if connection is not None:
            try:
                async with connection.transaction():
                    result = await attempt(connection)
                    if result is None:
                        raise _Nothing
                    return result
            except _Nothing:
                return None
        if not transaction:
            return await autocommitted(self.pool, attempt)

        async def pooled() -> str | None:
            async with self.pool.acquire() as conn, conn.transaction():
                return await attempt(conn)

        return await retry_on_disconnect(pooled, what="schedule", give_up_after=10)

    async def _debounce(
        self,
        row: NewJob,
        timing: Timing,
        func: Callable[..., Any],
        args: Any,
        kwargs: Any,
        connection: asyncpg.Connection | None,
    ) -> str:
        seconds, max_wait, merge = timing.seconds, timing.max_wait, timing.merge

        async def plain(conn: asyncpg.Connection) -> str | None:
            return await self.timing.debounce(conn, row, seconds, max_wait)

        async def merged(conn: asyncpg.Connection) -> str | None:
            holder = await self.timing.debounce_holder(conn, str(row.dedupe_key))
            if holder is None:
                # Inserted, or None when another call's row appeared meanwhile.
                return await self.timing.debounce(conn, row, seconds, max_wait, None, True)
            mine = merged_row(row, holder, timing, func, args, kwargs)
            if mine is None:
                return None  # claimed ahead: wait for its start or its hand-back
            return await self.timing.debounce(conn, mine, seconds, max_wait, holder[0], True)

        attempt = plain if merge is None else merged
        deadline = time.monotonic() + CLAIMED_WAIT
        pause = 0.005
        while True:
            if merge is None and connection is None:
                job_id = await retry_on_disconnect(
                    lambda: self._run(None, attempt, False), what="schedule", give_up_after=10
                )
            else:
                job_id = await self._run(connection, attempt, True)
            if job_id is not None:
                return job_id
            if time.monotonic() >= deadline:
                raise claimed_too_long(row)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)

    async def _throttle(
        self, row: NewJob, period: float, connection: asyncpg.Connection | None
    ) -> str:
        key = str(row.dedupe_key)

        async def attempt(conn: asyncpg.Connection) -> str | None:
            return await self.timing.throttle(conn, row, period)

        for _ in range(THROTTLE_ATTEMPTS):
            if connection is None:
                job_id = await retry_on_disconnect(
                    lambda: self._run(None, attempt, False), what="schedule", give_up_after=10
                )
            else:
                job_id = await self._run(connection, attempt, True)
            if job_id is not None:
                return job_id
            holder = await self.timing.throttle_holder(connection or self.pool, key)
            if holder is not None and holder[1]:
                return holder[0]
            # The period ended between the two statements: take the next one.
        raise throttle_race(key)


def merged_row(
    row: NewJob,
    holder: Sequence[Any],
    timing: Timing,
    func: Callable[..., Any],
    args: Any,
    kwargs: Any,
) -> NewJob | None:
    """``row`` with the task's merge of the pending ``holder``'s arguments
    (job_id, task_name, status, task_data) and the call's; the row as it is
    for a holder of another task; None if the holder is not pending (claimed
    ahead)."""
    _, task_name, status, task_data = holder
    if status != "pending":
        return None
    if task_name != row.task_name or timing.merge is None:
        return row
    new = merge_arguments(func, timing.merge, task_data, args, kwargs)
    data = encode_task_data(new.args, new.kwargs, row.task_name)
    if instrument.trace_injector is not None:
        root = f"schedule {row.task_name}" if is_workflow(func) else None
        data = instrument.trace_injector(data, root)
    return row._replace(task_data=data)


def claimed_too_long(row: NewJob) -> TimeoutError:
    return TimeoutError(
        f"debounce key {row.dedupe_key!r}: its job stayed claimed by a worker "
        f"that had not started it for {CLAIMED_WAIT:g} s; nothing was scheduled"
    )


def throttle_race(key: str) -> ValueError:
    return ValueError(
        f"throttle key {key!r}: its period ended {THROTTLE_ATTEMPTS} times while this "
        "call ran; nothing was scheduled, try again"
    )


def merge_arguments(
    func: Callable[..., Any],
    merge: Callable[[CallArguments, CallArguments], Any],
    previous_task_data: str,
    args: Any,
    kwargs: Any,
) -> CallArguments:
    """``merge(previous, new)`` checked: a CallArguments (or an (args, kwargs)
    pair) that ``func`` can take. Anything else, or an exception, raises here
    and nothing is written."""
    name = getattr(func, "__qualname__", repr(func))
    old_args, old_kwargs = decode_task_data(previous_task_data)
    previous = CallArguments(tuple(old_args), old_kwargs)
    new = CallArguments(tuple(args), dict(kwargs or {}))
    try:
        result = merge(previous, new)
    except Exception as exc:
        raise ValueError(
            f"the debounce_merge function of task {name} raised {type(exc).__name__}: {exc}; "
            "nothing was scheduled"
        ) from exc
    if (
        not isinstance(result, tuple)
        or len(result) != 2
        or not isinstance(result[0], tuple | list)
        or not isinstance(result[1], dict)
    ):
        raise TypeError(
            f"the debounce_merge function of task {name} must return CallArguments(args, "
            f"kwargs) (a tuple and a dict), got {clip_repr(result)}"
        )
    merged = CallArguments(tuple(result[0]), result[1])
    check_arguments(func, merged.args, merged.kwargs)
    return merged
