"""One run of a workflow: what it knows (its lease, its records, the database's
clock) and how it writes a record.

Every record goes through :meth:`RunState.record`: lease-guarded, written at
most once per place. When the place is already taken by a completed record
(a run that raced this one wrote it first), that record is adopted, as if
this run had replayed it. When the run no longer holds its job, it stops
(:class:`~.errors.LeaseLost`) and writes nothing more.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

import asyncpg

from ..store.workflows import Lease, WorkflowStore
from ..support.codec import decode_json, encode_json
from ..support.pool_release import autocommitted
from ..support.reconnect import is_connection_error, retry_on_disconnect
from ..tasks import TaskRegistry
from .errors import (
    DuplicateStep,
    Interrupted,
    LeaseLost,
    Parked,
    WorkflowError,
    WorkflowMismatch,
    WorkflowTimeout,
)
from .replay import Record, Replay, describe

T = TypeVar("T")

#: Seconds a write of a run keeps retrying while the database is unreachable.
WRITE_PATIENCE = 30.0

#: Crash points set by pg_scheduler.testing (``run_until_crash``): job id -> a
#: place. That job's run stops once it is past that place and its record is
#: written, as if its worker were killed there: nothing more is written (the
#: entry is removed when it fires). Empty outside tests.
CRASH_AFTER: dict[str, int] = {}


def interruption(job_id: str, error: BaseException) -> Interrupted:
    return Interrupted(
        f"job {job_id}: the connection to the database was lost under the run"
        f" ({type(error).__name__}: {error})"
    )


class UnstorableStep(WorkflowError, ValueError):
    """A step's result cannot be stored as JSON (the job fails without a retry:
    the same step would return the same value)."""

    __pg_scheduler_final__ = True


def encode_step_result(what: str, value: Any) -> str:
    """``value`` as the JSON its record stores, else :class:`UnstorableStep`."""
    try:
        return encode_json(value)
    except (TypeError, ValueError) as exc:
        raise UnstorableStep(
            f"{what} returned a value that cannot be stored as JSON ({exc}); "
            "return JSON types (str, int, float, bool, None, list, dict)"
        ) from None


class RunState:
    """The shared state of one run (see the module docstring)."""

    def __init__(
        self,
        store: WorkflowStore,
        lease: Lease,
        replay: Replay,
        *,
        incarnation: int,
        db_now: datetime,
        deadline: datetime | None,
        queue: str,
        priority: int,
        registry: TaskRegistry,
        lookahead: float,
    ) -> None:
        self.store = store
        self.lease = lease
        self.replay = replay
        self.incarnation = incarnation
        self.deadline = deadline
        self.queue = queue
        self.priority = priority
        self.registry = registry
        #: Seconds ahead of its wake time a parked row is made pending (the
        #: timer service's lookahead): a wake this near parks as pending.
        self.lookahead = lookahead
        self._db_now = db_now
        self._started = time.monotonic()
        #: Set once the run parked, lost its job or met a mismatch: every later
        #: call raises it again, and the run ends with it.
        self.stop: BaseException | None = None
        #: What a spawn with no option given decides from its function alone
        #: (checked, registered, its queue and task name), by function.
        self.spawn_plans: dict[Any, Any] = {}
        self._crash_after = CRASH_AFTER.get(lease.job_id) if CRASH_AFTER else None

    # -- the clock ---------------------------------------------------------------

    def now(self) -> datetime:
        """The database's clock as of the run's start, advanced by local time."""
        return self._db_now + timedelta(seconds=time.monotonic() - self._started)

    # -- stopping ------------------------------------------------------------------

    def check(self) -> None:
        if self.stop is not None:
            raise self.stop
        crash = self._crash_after
        if crash is not None and self.replay.next_seq > crash and crash in self.replay.records:
            CRASH_AFTER.pop(self.lease.job_id, None)
            raise self.halt(LeaseLost(f"job {self.lease.job_id}: stopped after step {crash}"))

    def halt(self, error: BaseException) -> BaseException:
        """Remember why the run ends (the first reason wins); returns it to raise."""
        if self.stop is None:
            self.stop = error
        return self.stop

    @asynccontextmanager
    async def locked(self) -> AsyncIterator[tuple[asyncpg.Connection, asyncpg.Record]]:
        """A transaction holding this run's own row locked, its lease checked (the
        run's lost error if the job is no longer its own). A park reads next, in a
        new statement, so it sees every signal or child's end committed before
        the lock: whatever came meanwhile waited for it, and finds the row parked."""
        try:
            async with self.store.pool.acquire() as conn, conn.transaction():
                row = await self.store.lock_run(conn, self.lease)
                if row is None:
                    raise self.lost()
                yield conn, row
        except Exception as exc:
            # Nothing of the block committed, or its commit was cut off: the
            # next run finds out from the row and the records.
            if is_connection_error(exc):
                raise self.interrupted(exc) from exc
            raise

    def deadline_passed(self) -> WorkflowTimeout:
        return WorkflowTimeout(
            "the workflow ran past its deadline"
            f" ({self.deadline.isoformat() if self.deadline else '?'}:"
            " its timeout counts from its first start, across parks)"
        )

    def lost(self) -> BaseException:
        return self.halt(LeaseLost(f"job {self.lease.job_id} is no longer this run's"))

    def parked(self) -> BaseException:
        return self.halt(Parked())

    def interrupted(self, error: BaseException) -> BaseException:
        """The run's end when one of its own statements lost its connection
        (``error``): see :class:`~.errors.Interrupted`."""
        return self.halt(interruption(self.lease.job_id, error))

    def take(self, kind: str, name: str, key: str) -> tuple[int, Record | None]:
        """The next place and its record (see Replay.take); a mismatch or a
        duplicate ends the run, whatever the workflow makes of the exception."""
        self.check()
        try:
            return self.replay.take(kind, name, key)
        except (WorkflowMismatch, DuplicateStep) as exc:
            raise self.halt(exc) from None

    # -- writing -------------------------------------------------------------------

    async def write(self, operation: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """One self-committing statement on a pooled connection, retried while
        the database is unreachable."""
        pool = self.store.pool
        return await self.patiently(lambda: autocommitted(pool, operation))

    async def patiently(self, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation()``, retried for WRITE_PATIENCE seconds while the database
        is unreachable; after that, the run is interrupted."""
        try:
            return await retry_on_disconnect(
                operation, what="workflow step", give_up_after=WRITE_PATIENCE
            )
        except Exception as exc:
            if is_connection_error(exc):
                raise self.interrupted(exc) from exc
            raise

    async def record(
        self,
        seq: int,
        kind: str,
        name: str,
        key: str,
        status: str,
        result: str | None,
        error: str | None = None,
        attempts: int = 1,
        started_at: datetime | None = None,
    ) -> Record:
        """Write the record at ``seq`` (or adopt the completed one there)."""
        lease = self.lease
        try:
            held, written = await self.write(
                lambda c: self.store.checkpoint(
                    c, lease, seq, kind, name, key, status, result, error, attempts, started_at
                )
            )
        except asyncpg.UniqueViolationError:
            # The name and key are taken: by a run racing this one at this very
            # place (adopt it), or at another place (a mismatch).
            return await self.adopt(seq, kind, name, key)
        except asyncpg.DataError as exc:
            raise UnstorableStep(
                f"{describe(kind, name, key)}: the database refused its record ({exc})"
            ) from None
        if written:
            made = Record(seq, kind, name, key, status, decode_json(result), error, attempts)
            self.replay.keep(made)
            return made
        if not held:
            raise self.lost()
        return await self.adopt(seq, kind, name, key)

    async def adopt(self, seq: int, kind: str, name: str, key: str) -> Record:
        """The completed record another run wrote at ``seq``, if it is this
        step's; else (nothing there: this name and key are recorded at another
        place) a mismatch."""
        row = await self.patiently(
            lambda: self.store.record(self.store.pool, self.lease.job_id, seq)
        )
        if row is None:
            raise self.halt(self.name_taken(kind, name, key))
        found = Record(
            seq,
            row["kind"],
            row["name"],
            row["key"],
            row["status"],
            decode_json(row["result"]),
            row["error"],
            row["attempts"],
        )
        if (found.kind, found.name, found.key) != (kind, name, key):
            raise self.halt(
                WorkflowMismatch(
                    f"step {seq} was recorded as {describe(found.kind, found.name, found.key)} "
                    f"by another run while this one reached {describe(kind, name, key)}"
                )
            )
        self.replay.keep(found)
        return found

    def name_taken(self, kind: str, name: str, key: str) -> WorkflowMismatch:
        return WorkflowMismatch(
            f"{describe(kind, name, key)} is recorded at another place of this workflow; "
            "its code changed while it ran (or two steps share a name and key)"
        )
