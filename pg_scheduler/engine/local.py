"""The in-process start: a due job enqueued in this process starts here at once.

``schedule()`` of a job due now, autocommitted, with a started Scheduler of
this process (same pool and schema, task registered, the job's queue served
and not paused) that has a free slot:
the row is written already claimed by that worker (``store.insert_running``)
and started without a NOTIFY hop or a claim. All of it is here: the choice of
worker, reserving its slot, the write, and starting the row that came back.

The job always runs in its own task, created as the last step of
``schedule()``: it never runs inside the caller's await. The connection the
insert used goes back to the pool in the background, after that.

A caller cancelled while the insert is in flight (a request that timed out, a
task group torn down) does not know whether the row landed: it is handed back
at once, in the background, as never started (attempt not counted), and runs
through a claim like any pending job. Shutdown waits for inserts in flight
(:func:`settled`) before it hands back what this worker holds and does not run.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import asyncpg

from ..store import NewJob, Store
from ..support.log import get_logger
from ..support.pool_release import autocommitted
from ..support.reconnect import is_connection_error, retry_on_disconnect
from ..tasks import TaskRegistry
from .claimer import Worker

log = get_logger("pg_scheduler.worker")

# Jobs due later than this (by this process's clock) are not tried locally.
LOCAL_START_HORIZON = timedelta(seconds=1)


class LocalHost(Protocol):
    """What the choice needs of a Scheduler."""

    start_due_jobs_locally: bool
    db_pool: asyncpg.Pool
    schema: str
    registry: TaskRegistry
    worker: Worker


# Started Schedulers of this process: schedule() hands them due jobs directly.
_started: weakref.WeakSet[LocalHost] = weakref.WeakSet()
# Workers shutting down with inserts in flight: set when the last one answers.
_settling: weakref.WeakKeyDictionary[Worker, asyncio.Event] = weakref.WeakKeyDictionary()


def offer(host: LocalHost) -> None:
    """``host`` has started: it may run this process's due jobs."""
    _started.add(host)


def withdraw(host: LocalHost) -> None:
    _started.discard(host)


def local_worker(me: LocalHost, row: NewJob) -> Worker | None:
    """A running worker of this process, on ``me``'s pool and schema, that runs
    ``row``'s task (``me`` first)."""
    if row.execution_time > datetime.now(UTC) + LOCAL_START_HORIZON:
        return None
    for host in (me, *_started):
        if (
            host in _started
            and host.start_due_jobs_locally
            and host.db_pool is me.db_pool
            and host.schema == me.schema
            and host.registry.resolve(row.task_name) is not None
            # A batch task's jobs wait for their batch (engine/batch.py).
            and not host.worker.batches.is_batch(row.task_name)
            and host.worker.slots.queue_has_room(row.queue)
            # A limited task or queue starts only through the limited claim.
            and not host.worker.limits.is_limited(row.task_name, row.queue)
            # A job with a fair share key starts only through the fair claim.
            and row.fair_share_key is None
        ):
            return host.worker
    return None


def reserve(worker: Worker, row: NewJob) -> bool:
    """Hold a free slot of ``worker`` (and of ``row``'s queue) for a due job this
    process is enqueueing. It counts as a claim in flight, so the heartbeat
    hands the row back if the insert's answer is lost."""
    state = worker.state
    if not state.claiming or not worker.slots.reserve(row.job_id, row.queue):
        return False
    state.claims_in_flight += 1
    state.claims_sent += 1
    return True


def finish(worker: Worker, job_id: str, row: Mapping[str, Any] | None) -> bool:
    """Start the inserted row if it came back running here; else free the slot."""
    state = worker.state
    state.claims_in_flight -= 1
    if not state.claiming and state.claims_in_flight <= 0:
        event = _settling.get(worker)
        if event is not None:
            event.set()
    if row is not None and row["status"] == "running":
        worker.executor.check_log_levels()
        worker.starts.accept(row, local=True)
        return True
    worker.slots.let_go(job_ids=(job_id,))
    return False


async def write_started(
    pool: asyncpg.Pool, store: Store, row: NewJob, worker: Worker
) -> bool | None:
    """Write a due row already claimed by ``worker`` (of this process), which
    starts it at once. True: written (started, or pending when the database
    says it is not due yet). False: ``worker`` has no free slot, nothing
    written. None: the connection was lost, the row may or may not be
    written; ``Enqueuer.write(..., retried=True)`` settles it (and the heartbeat
    hands back a row that did land)."""
    if not reserve(worker, row):
        return False
    claimed = None
    try:
        # The connection goes back to the pool in the background: asyncpg's
        # reset round trip (0.3-1.3 ms here) no longer sits between the insert
        # and the job's start.
        claimed = await autocommitted(
            pool,
            lambda conn: store.insert_running(conn, row, worker.worker_id, worker.lease_seconds()),
        )
    except BaseException as exc:
        finish(worker, row.job_id, claimed)  # written: start it anyway; else free the slot
        if claimed is None:
            # Cancelled or cut off mid-insert: the row may have landed, running
            # here, and nobody would start it.
            _hand_back_later(store, worker, row.job_id)
        if isinstance(exc, Exception) and is_connection_error(exc):
            return None if claimed is None else True
        raise
    # Nothing is awaited after the job's task is created, so it first runs
    # after schedule() has returned: a job that blocks the loop cannot hold up
    # its caller.
    finish(worker, row.job_id, claimed)
    return True


def _hand_back_later(store: Store, worker: Worker, job_id: str) -> None:
    """Hand back ``job_id``'s row if the insert landed (one statement, in the
    background: the caller is being cancelled). The pool took the insert's
    connection back first, and asyncpg gives back a connection whose
    statement was cancelled only once the server has answered it, so the row
    has landed or never will. (A caller cancelled again during that wait
    leaves a row that lands later to the heartbeat, or to shutdown.)"""

    async def hand_back() -> None:
        try:
            released = await retry_on_disconnect(
                lambda: store.release_local_start(worker.worker_id, job_id),
                what="hand back",
                give_up_after=30,
            )
        except Exception as exc:
            log.warning(
                "could not hand back an interrupted in-process start; the heartbeat will",
                job_id=job_id,
                error=repr(exc),
            )
            return
        if released:
            log.info(
                "handed back an in-process start whose caller was cancelled",
                job_id=job_id,
                worker_id=worker.worker_id,
            )

    task = asyncio.get_running_loop().create_task(hand_back())
    worker.state.tasks_background.add(task)
    task.add_done_callback(worker.state.tasks_background.discard)


async def settled(worker: Worker, timeout: float) -> None:
    """Shutdown (claiming stopped): wait up to ``timeout`` for the in-process
    starts in flight on ``worker`` to answer (started, buffered or handed back)."""
    if worker.state.claims_in_flight <= 0:
        return
    event = _settling.setdefault(worker, asyncio.Event())
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        log.warning(
            "in-process starts still unanswered at shutdown; the rescuer will return them",
            worker_id=worker.worker_id,
            in_flight=worker.state.claims_in_flight,
        )
    finally:
        _settling.pop(worker, None)
