"""The completer: group commit of completions, and writing a failed attempt.

A job that returned is completed through :class:`Completer` (one UPDATE for
everything that finished meanwhile); a failed attempt is written by
:func:`write_failure` (retry or fail, one statement). Both keep the lease guard:
a worker that lost a job to the rescuer never overwrites what happened to it.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import asyncpg

from ..codec import (
    ERROR_MAX_CHARS,
    TRACEBACK_MAX_CHARS,
    clip_text,
    storable_text,
    unstorable_result_reason,
)
from ..log import get_logger
from ..reconnect import is_connection_error, retry_on_disconnect
from ..store import Completion, Store
from ..store.names import Executor
from .held import HeldConnection

log = get_logger("pg_scheduler.worker")

# What a refused write's fallback stores: fixed ASCII, so it cannot be refused.
_UNSTORABLE_ERROR = "the job's error text could not be stored"


def _refused(exc: BaseException) -> bool:
    """The database (or asyncpg, encoding a parameter) refused the data, not the connection."""
    return isinstance(exc, asyncpg.DataError | UnicodeError) or (
        isinstance(exc, asyncpg.InterfaceError | ValueError)
        and not is_connection_error(exc)
        and "invalid input" in str(exc)
    )


async def write_failure(
    store: Store,
    job_id: str,
    worker_id: str,
    attempt: int,
    message: str,
    trace: str | None,
    retry_delay: float | None = None,
) -> Any:
    """Write a failed attempt (``retry_delay`` given: back to pending, else failed).

    Error text and traceback are cut to their limits; text the database
    refuses (NUL, lone surrogates) is escaped and written again, and if even
    that is refused a fixed message is stored: a failure is always recorded,
    so the job never runs again because its outcome could not be written.
    Returns what the store returns (falsy: the lease was lost).
    """
    message = clip_text(message, ERROR_MAX_CHARS)
    trace = None if trace is None else clip_text(trace, TRACEBACK_MAX_CHARS)

    async def write(error: str, tb_text: str | None) -> Any:
        op: Callable[[], Awaitable[Any]]
        if retry_delay is None:
            op = partial(store.fail, job_id, worker_id, attempt, error, tb_text)
        else:
            op = partial(store.retry, job_id, worker_id, attempt, retry_delay, error, tb_text)
        return await retry_on_disconnect(op, what="fail" if retry_delay is None else "retry")

    try:
        return await write(message, trace)
    except Exception as exc:
        if not _refused(exc):
            raise
    try:
        return await write(storable_text(message), None if trace is None else storable_text(trace))
    except Exception as exc:
        if not _refused(exc):
            raise
        return await write(f"{_UNSTORABLE_ERROR} ({type(exc).__name__})", None)


def _settle_future(future: asyncio.Future[bool | str], outcome: Any) -> None:
    if not future.done():  # a cancelled waiter leaves its completion queued and written
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


# A queued completion, what settles it, and the settle's first argument.
_Entry = tuple[Completion, Callable[[Any, Any], None], Any]


class Completer:
    """Group commit for completions: one UPDATE for everything that finished meanwhile.

    A completion waits for the flush in flight, never for a timer, so an idle
    worker writes each completion at once and a busy one writes hundreds per
    statement. A flush that hits a lost connection is retried until it lands;
    the lease guard makes the retry harmless. Each queued completion is
    settled exactly once, after its write or when it is given up on.
    """

    def __init__(
        self,
        store: Store,
        worker_id: str,
        delete_completed: Callable[[], bool],
        max_batch: int = 1000,
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._delete_completed = delete_completed
        self._max_batch = max_batch
        self._queue: list[_Entry] = []
        self._flusher: asyncio.Task[None] | None = None
        self._unwritten = 0
        self.connection = HeldConnection(store.pool)
        #: Held while a completion statement runs. The heartbeat takes it too:
        #: both lock this worker's running rows, each in its own order, and
        #: run concurrently they could deadlock (PostgreSQL then aborts one
        #: after deadlock_timeout, a one-second stall of every completion).
        self.statement_lock = asyncio.Lock()

    @property
    def pending(self) -> int:
        """Completions queued or being written."""
        return self._unwritten

    def queue(self, completion: Completion, settle: Callable[[Any, Any], None], arg: Any) -> None:
        """Queue a completion; ``settle(arg, outcome)`` is called once it is settled:
        outcome True (written), False (the lease was already lost), the error
        recorded instead (the database refused the result), or the exception
        that kept it from being written. ``settle`` must not raise."""
        self._unwritten += 1
        self._queue.append((completion, settle, arg))
        flusher = self._flusher
        if flusher is None or flusher.done():
            # Usually called from a job's task: in an empty context, so the
            # flusher neither runs as that job (current_job()) nor keeps it alive.
            self._flusher = asyncio.create_task(self._flush_all(), context=contextvars.Context())

    async def submit(self, completion: Completion) -> bool | str:
        """Queue a completion and wait for it: True once written, False if the lease
        was already lost, or the error recorded instead when the database refused the result."""
        future: asyncio.Future[bool | str] = asyncio.get_running_loop().create_future()
        self.queue(completion, _settle_future, future)
        # No shield needed: a cancelled waiter leaves its completion queued and written.
        return await future

    def _settle(self, entries: list[_Entry], outcome: Any) -> None:
        self._unwritten -= len(entries)
        for _, settle, arg in entries:
            try:
                settle(arg, outcome)
            except Exception as exc:  # a bug: never let it settle the rest twice
                log.error("settling a completion failed", error=repr(exc))

    def _give_up(self, entries: list[_Entry], why: str) -> None:
        self._unwritten -= len(entries)
        for _, settle, arg in entries:
            try:
                settle(arg, ConnectionError(why))
            except Exception as exc:
                log.error("settling a completion failed", error=repr(exc))

    async def _complete(self, batch: list[_Entry]) -> None:
        done = [c for c, _, _ in batch]

        async def write(db: Executor) -> set[str]:
            async with self.statement_lock:
                return await self._store.complete(
                    self._worker_id, done, self._delete_completed(), db
                )

        written = await retry_on_disconnect(lambda: self.connection.run(write), what="complete")
        self._unwritten -= len(batch)
        for completion, settle, arg in batch:
            try:
                settle(arg, completion.job_id in written)
            except Exception as exc:  # a bug: never let it settle the rest twice
                log.error("settling a completion failed", error=repr(exc))

    async def _complete_isolating(self, batch: list[_Entry], settled: set[int]) -> None:
        """The batch was refused for its data: write the good rows, fail the bad ones.

        Results whose JSON may hold what jsonb refuses (NUL, surrogate
        escapes) are tried alone, the rest together; a refused group is split
        in halves until the refused rows stand alone, and each of those is
        recorded as failed with the reason: never left running to run again.
        ``settled``: ids of the entries settled so far (for the caller, if this raises).
        """
        suspect = [
            entry
            for entry in batch
            if entry[0].result is not None
            and ("\\u0000" in entry[0].result or "\\ud" in entry[0].result)
        ]
        ids = {entry[0].job_id for entry in suspect}
        groups = [[entry] for entry in suspect]
        rest = [entry for entry in batch if entry[0].job_id not in ids]
        if rest:
            groups.append(rest)
        while groups:
            group = groups.pop()
            try:
                await self._complete(group)
                settled.update(map(id, group))
                continue
            except Exception as exc:
                if not _refused(exc):
                    raise
                refusal = exc
            if len(group) > 1:
                half = len(group) // 2
                groups += [group[:half], group[half:]]
                continue
            completion = group[0][0]
            reason = unstorable_result_reason(completion.result or "null")
            reason = f"{reason} ({type(refusal).__name__})"
            recorded = await write_failure(
                self._store, completion.job_id, self._worker_id, completion.attempt, reason, None
            )
            settled.add(id(group[0]))
            self._settle(group, reason if recorded else False)

    async def _flush_all(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            settled: set[int] = set()
            try:
                try:
                    await self._complete(batch)
                except Exception as exc:
                    if not _refused(exc):
                        raise
                    await self._complete_isolating(batch, settled)
            except BaseException as exc:
                # A bug, or shutdown gave up during an outage: the rows stay
                # 'running' and will be rescued, so nothing is lost.
                log.error("writing completions failed", error=repr(exc), jobs=len(batch))
                unsettled = [entry for entry in batch if id(entry) not in settled]
                self._give_up(unsettled, f"completion not written: {exc!r}")
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait for queued completions to be written, at most ``timeout`` seconds.

        Past that (the database is down), give up: the rows stay ``running``
        and the rescuer returns them, so the jobs run again (at-least-once).
        """
        flusher = self._flusher
        if flusher is None or flusher.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(flusher), timeout)
        except TimeoutError:
            flusher.cancel()
            queued, self._queue = self._queue, []
            self._give_up(queued, "completion not written at shutdown")
            log.error(
                "completions not written before shutdown; their jobs will be rescued and run again",
                jobs=len(queued),
            )
