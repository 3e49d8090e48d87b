"""The completer: group commit of completions, and writing a failed attempt.

A job that returned is completed through :class:`Completer` (one UPDATE for
everything that finished meanwhile); a failed attempt is written by
:func:`write_failure` (retry or fail, one statement). Both keep the lease guard:
a worker that lost a job to the rescuer never overwrites what happened to it.

A write that fails for another reason than a lost connection never makes a
job run again while its outcome can still be recorded: a completion batch
the database did not take (a statement_timeout, lock_timeout or cancel while
another session holds one of its rows) is written again without waiting for
row locks, and the rows it could not lock are written as soon as their lock
is gone; a failed attempt whose retry cannot be stored is recorded as a final
failure.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Literal, NamedTuple

import asyncpg
from asyncpg import exceptions as pgerr

from ..store import Completion, Store
from ..store.names import Executor
from ..support.codec import (
    ERROR_MAX_CHARS,
    TRACEBACK_MAX_CHARS,
    clip_text,
    storable_text,
    unstorable_result_reason,
)
from ..support.log import get_logger
from ..support.reconnect import (
    Backoff,
    is_connection_error,
    is_rolled_back_conflict,
    retry_on_disconnect,
)
from .hand_off import HandOff
from .held import HeldConnection

log = get_logger("pg_scheduler.worker")

# What a refused write's fallback stores: fixed ASCII, so it cannot be refused.
_UNSTORABLE_ERROR = "the job's error text could not be stored"

# How long a write that the database did not take waits before it is tried
# again: from 50 ms, doubling, at most this many seconds.
HELD_BACK_MAX_WAIT = 1.0


# What keeps the database from taking a write now without anything being wrong
# with it: a statement_timeout or cancel (57014), a lock_timeout (55P03), a
# lack of resources (53xxx), a read-only database (25006, during a failover).
# Such a write is tried again, unchanged; a lost connection or a deadlock is
# retried by retry_on_disconnect before it gets here.
_HELD_BACK = (
    pgerr.QueryCanceledError,
    pgerr.LockNotAvailableError,
    pgerr.InsufficientResourcesError,
    pgerr.ReadOnlySQLTransactionError,
)


def _refused(exc: BaseException) -> bool:
    """The database (or asyncpg, encoding a parameter) refused the write itself:
    its data (class 22), a constraint or a trigger, not the connection and not
    a timeout. Writing the same thing again would be refused again."""
    if isinstance(exc, asyncpg.PostgresError):
        return not (
            isinstance(exc, _HELD_BACK) or is_connection_error(exc) or is_rolled_back_conflict(exc)
        )
    return isinstance(exc, UnicodeError) or (
        isinstance(exc, asyncpg.InterfaceError | ValueError)
        and not is_connection_error(exc)
        and "invalid input" in str(exc)
    )


def _refusal_reason(completion: Completion, exc: BaseException) -> str:
    """What a completion refused for its own sake is recorded as failed with."""
    if isinstance(exc, asyncpg.DataError | UnicodeError | ValueError):
        reason = unstorable_result_reason(completion.result or "null")
        return f"{reason} ({type(exc).__name__})"
    return clip_text(
        f"result not stored: the database refused it ({type(exc).__name__}: "
        f"{storable_text(str(exc))})",
        ERROR_MAX_CHARS,
    )


class FailureWritten(NamedTuple):
    """What :func:`write_failure` recorded: ``retried`` (pending again),
    ``failed`` (final; ``error`` is the text stored) or ``lost`` (this attempt
    no longer held the job: nothing written)."""

    outcome: Literal["retried", "failed", "lost"]
    error: str


async def write_failure(
    store: Store,
    job_id: str,
    worker_id: str,
    attempt: int,
    message: str,
    trace: str | None,
    retry_delay: float | None = None,
    *,
    patient: bool = True,
) -> FailureWritten:
    """Write a failed attempt (``retry_delay`` given: back to pending, else failed).

    Error text and traceback are cut to their limits. What the database
    refuses for its data is written in a simpler form, in this order: the
    text escaped (NUL, lone surrogates); then, for a retry (its time cannot
    be stored, say), a final failure saying so; then a fixed message. So a
    failed attempt is always recorded and never runs again because its
    outcome could not be written. A write the database did not take for
    another reason (a statement_timeout, lock_timeout or cancel, while
    another session holds the row) is tried again after a short wait, until
    it is written or the lease guard says the job is no longer this
    attempt's; ``patient=False``: raise instead of waiting.
    """
    message = clip_text(message, ERROR_MAX_CHARS)
    trace = None if trace is None else clip_text(trace, TRACEBACK_MAX_CHARS)

    def stages() -> list[tuple[float | None, Callable[[BaseException | None], str], str | None]]:
        escaped_trace = None if trace is None else storable_text(trace)
        plan: list[tuple[float | None, Callable[[BaseException | None], str], str | None]] = [
            (retry_delay, lambda _: message, trace),
            (retry_delay, lambda _: storable_text(message), escaped_trace),
        ]
        if retry_delay is not None:
            plan.append(
                (
                    None,
                    lambda exc: clip_text(
                        f"{storable_text(message)} [no retry: the retry could not be written"
                        f" ({type(exc).__name__}: {storable_text(str(exc))}); recorded as failed]",
                        ERROR_MAX_CHARS,
                    ),
                    escaped_trace,
                )
            )
        plan.append((None, lambda exc: f"{_UNSTORABLE_ERROR} ({type(exc).__name__})", None))
        return plan

    refusal: BaseException | None = None
    for delay, error_of, tb_text in stages():
        error = error_of(refusal)
        op: Callable[[], Awaitable[Any]]
        if delay is None:
            op = partial(store.fail, job_id, worker_id, attempt, error, tb_text)
        else:
            op = partial(store.retry, job_id, worker_id, attempt, delay, error, tb_text)
        what = "fail" if delay is None else "retry"
        backoff = Backoff(initial=0.05, maximum=HELD_BACK_MAX_WAIT)
        while True:
            try:
                written = await retry_on_disconnect(op, what=what)
            except Exception as exc:
                if _refused(exc):
                    log.warning(
                        "failed attempt refused by the database; writing it simpler",
                        job_id=job_id,
                        operation=what,
                        error=repr(exc),
                    )
                    refusal = exc
                    break
                if not patient:
                    raise
                delay_s = backoff.next_delay()
                log.warning(
                    "failed attempt not written, trying again",
                    job_id=job_id,
                    operation=what,
                    error=repr(exc),
                    retry_in=round(delay_s, 3),
                )
                await asyncio.sleep(delay_s)
                continue
            if delay is None:
                return FailureWritten("failed" if written else "lost", error)
            return FailureWritten("retried" if written is not None else "lost", error)
    # The last stage stores fixed ASCII: only a bug gets here.
    raise RuntimeError(f"failed attempt of {job_id} not recorded: {refusal!r}")


def _settle_future(future: asyncio.Future[bool | str], outcome: Any) -> None:
    if not future.done():  # a cancelled waiter leaves its completion queued and written
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


# A queued completion, what settles it, and the settle's first argument.
_Entry = tuple[Completion, Callable[[Any, Any], None], Any]
# How the completer runs a statement: on its held connection, or on the pool.
_Run = Callable[[Callable[[Executor], Awaitable[Any]]], Awaitable[Any]]


class Completer:
    """Group commit for completions: one UPDATE for everything that finished meanwhile.

    A completion waits for the flush in flight, never for a timer, so an idle
    worker writes each completion at once and a busy one writes hundreds per
    statement. A flush that hits a lost connection is retried until it lands;
    the lease guard makes the retry harmless. Each queued completion is
    settled exactly once, after its write or when it is given up on.

    A batch the database did not take for another reason is written apart
    (:meth:`_write_apart`): every row no other session has locked at once,
    in one statement that never waits for a row lock; rows refused for their
    data are split out and recorded as failed; rows locked elsewhere (or a
    group the database keeps refusing for no fault of its data) are *held
    back* and written by a separate task, every 50 ms to 1 s, as soon as they
    can be. A held-back completion is given up only when the lease guard says
    the job is no longer this attempt's (it was rescued or cancelled
    meanwhile), or at shutdown.
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
        #: Completions the database did not take yet (a row locked elsewhere),
        #: with the reason to record instead when the result itself was refused.
        self._held_back: list[tuple[_Entry, str | None]] = []
        self._rewriter: asyncio.Task[None] | None = None
        #: Takes over the dependents a batch releases (engine/hand_off.py); None: never.
        self.hand_off: HandOff | None = None

    @property
    def pending(self) -> int:
        """Completions queued, being written, or held back."""
        return self._unwritten

    @property
    def held_back(self) -> int:
        """Completions waiting for a row another session has locked (or a retry)."""
        return len(self._held_back)

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

    def _settle_written(self, entries: list[_Entry], written: set[str]) -> None:
        self._unwritten -= len(entries)
        for completion, settle, arg in entries:
            try:
                settle(arg, completion.job_id in written)
            except Exception as exc:  # a bug: never let it settle the rest twice
                log.error("settling a completion failed", error=repr(exc))

    def _give_up(self, entries: list[_Entry], why: str) -> None:
        self._settle(entries, ConnectionError(why))

    async def _complete(self, batch: list[_Entry]) -> None:
        """The normal path: the whole batch in one statement."""
        done = [c for c, _, _ in batch]
        delete = self._delete_completed()
        hand_off = self.hand_off
        offered = None
        if hand_off is not None and not delete and any(c.has_dependents for c in done):
            offered = hand_off.offer(len(done))
        if hand_off is None or offered is None:

            async def write(db: Executor) -> set[str]:
                return await self._store.complete(self._worker_id, done, delete, db)

            written = await retry_on_disconnect(lambda: self.connection.run(write), what="complete")
            self._settle_written(batch, written)
            return
        room, claim = offered
        handed: list[asyncpg.Record] = []

        async def write_handing(db: Executor) -> tuple[set[str], list[asyncpg.Record]]:
            return await self._store.complete_handing(self._worker_id, done, room, db)

        try:
            written, handed = await retry_on_disconnect(
                lambda: self.connection.run(write_handing), what="complete"
            )
        finally:
            await hand_off.taken(claim, handed)
        self._settle_written(batch, written)

    async def _pool_run(self, operation: Callable[[Executor], Awaitable[Any]]) -> Any:
        return await operation(self._store.pool)

    async def _write_apart(
        self,
        batch: list[_Entry],
        settled: set[int],
        held: list[tuple[_Entry, str | None]],
        run: _Run,
    ) -> None:
        """Write what can be written of a batch its statement did not write.

        Each group is written by a statement that never waits for a row lock
        (``Store.complete_unlocked``). Results whose JSON may hold what jsonb
        refuses (NUL, surrogate escapes) are tried alone, the rest together;
        a group refused for its data is split in halves until the refused
        rows stand alone, and each of those is recorded as failed with the
        reason: never left running to run again. Appends to ``held`` what is
        held back: rows another session has locked, and groups the database
        did not take for another reason (their data is not at fault: split,
        they would only cost a statement each). ``settled``: ids of the
        entries settled or held back so far, for the caller, if this raises.
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
            done = [c for c, _, _ in group]
            write = partial(
                self._store.complete_unlocked, self._worker_id, done, self._delete_completed()
            )
            try:
                written, elsewhere = await retry_on_disconnect(partial(run, write), what="complete")
            except Exception as exc:
                if not _refused(exc):
                    log.warning(
                        "completions not written; trying again",
                        error=repr(exc),
                        jobs=len(group),
                    )
                    held += [(entry, None) for entry in group]
                    settled.update(map(id, group))
                    continue
                if len(group) > 1:
                    half = len(group) // 2
                    groups += [group[:half], group[half:]]
                    continue
                reason = _refusal_reason(group[0][0], exc)
                if not await self._record_refused(group[0], reason):
                    held.append((group[0], reason))
                settled.add(id(group[0]))
                continue
            kept = [entry for entry in group if entry[0].job_id in elsewhere]
            done_here = [entry for entry in group if entry[0].job_id not in elsewhere]
            self._settle_written(done_here, written)
            held += [(entry, None) for entry in kept]
            settled.update(map(id, group))

    async def _record_refused(self, entry: _Entry, reason: str) -> bool:
        """Record as failed a completion whose result the database refused;
        False: not written now (the row is locked elsewhere), try again later."""
        completion = entry[0]
        try:
            recorded = await write_failure(
                self._store,
                completion.job_id,
                self._worker_id,
                completion.attempt,
                reason,
                None,
                patient=False,
            )
        except Exception as exc:
            log.warning(
                "failure of a refused result not written; trying again",
                job_id=completion.job_id,
                error=repr(exc),
            )
            return False
        self._settle([entry], recorded.error if recorded.outcome == "failed" else False)
        return True

    def _hold_back(self, held: list[tuple[_Entry, str | None]]) -> None:
        if not held:
            return
        self._held_back += held
        rewriter = self._rewriter
        if rewriter is None or rewriter.done():
            log.warning(
                "completions held back (a row locked by another session, or the database"
                " did not take the statement); writing them as soon as it can",
                jobs=len(held),
                job_ids=[entry[0].job_id for entry, _ in held[:10]],
                worker_id=self._worker_id,
            )
            self._rewriter = asyncio.create_task(
                self._write_held_back(), context=contextvars.Context()
            )

    async def _write_held_back(self) -> None:
        """Write the held-back completions, apart from the flusher, until none is left."""
        backoff = Backoff(initial=0.05, maximum=HELD_BACK_MAX_WAIT)
        while self._held_back:
            await asyncio.sleep(backoff.next_delay())
            round_, self._held_back = self._held_back, []
            handled: set[int] = set()  # settled, or in still
            still: list[tuple[_Entry, str | None]] = []
            plain = [entry for entry, reason in round_ if reason is None]
            try:
                for start in range(0, len(plain), self._max_batch):
                    chunk = plain[start : start + self._max_batch]
                    try:
                        await self._write_apart(chunk, handled, still, self._pool_run)
                    except Exception as exc:
                        log.error("writing completions failed", error=repr(exc), jobs=len(chunk))
                        still += [(e, None) for e in chunk if id(e) not in handled]
                        handled.update(map(id, chunk))
                for entry, reason in round_:
                    if reason is not None:
                        if not await self._record_refused(entry, reason):
                            still.append((entry, reason))
                        handled.add(id(entry))
            finally:
                # Cancelled (shutdown) midway: what this round did not settle stays held.
                rest = [item for item in round_ if id(item[0]) not in handled]
                self._held_back[:0] = still + rest
            if len(still) < len(round_):
                backoff.reset()
                if not still:
                    log.info("held-back completions written", jobs=len(round_))

    async def _flush_all(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            settled: set[int] = set()
            held: list[tuple[_Entry, str | None]] = []
            try:
                try:
                    await self._complete(batch)
                except Exception as exc:
                    # Not a lost connection (retried above): written apart, so
                    # a row that cannot be written now costs no other row.
                    log.warning(
                        "completion batch not written; writing its rows apart",
                        error=repr(exc),
                        jobs=len(batch),
                    )
                    await self._write_apart(batch, settled, held, self.connection.run)
            except BaseException as exc:
                # A bug, or shutdown gave up during an outage: the rows stay
                # 'running' and will be rescued, so nothing is lost.
                log.error("writing completions failed", error=repr(exc), jobs=len(batch))
                unsettled = [entry for entry in batch if id(entry) not in settled]
                self._give_up(unsettled, f"completion not written: {exc!r}")
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            finally:
                self._hold_back(held)

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait for queued and held-back completions to be written, at most ``timeout`` seconds.

        Past that (the database is down, or a row stays locked elsewhere),
        give up: the rows stay ``running`` and the rescuer returns them, so
        the jobs run again (at-least-once).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # The flusher first: it may hold rows back, starting the rewriter.
        for name in ("_flusher", "_rewriter"):
            task: asyncio.Task[None] | None = getattr(self, name)
            if task is None or task.done():
                continue
            await asyncio.wait([task], timeout=max(0.0, deadline - loop.time()))
            if not task.done():
                task.cancel()
                await asyncio.wait([task])
        queued, self._queue = self._queue, []
        held, self._held_back = self._held_back, []
        given_up = queued + [entry for entry, _ in held]
        if given_up:
            self._give_up(given_up, "completion not written at shutdown")
            log.error(
                "completions not written before shutdown; their jobs will be rescued and run again",
                jobs=len(given_up),
            )
