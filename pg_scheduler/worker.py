"""The engine of one Scheduler: claim due jobs, run them, write their outcome.

Flow: the claim loop asks for up to ``min(free capacity, batch_claim_limit)``
jobs in one statement; each claimed job runs in its own task under the
``max_concurrent_jobs`` semaphore; completions are written in batches by
:class:`AckBatcher`; failures, retries and releases one statement each.
Every write out of ``running`` carries the lease guard (worker id + attempt),
so a worker that lost a job to the rescuer can never overwrite its outcome.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback as tb
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from .codec import decode_json, decode_task_data, encode_json, encode_result
from .config import PollingConfig, RetryPolicy
from .held import HeldConnection
from .log import get_logger
from .reconnect import Backoff, is_connection_error, retry_on_disconnect
from .store import Completion, Store
from .tasks import TaskRegistry

log = get_logger(__name__)


def _enabled(level: int) -> bool:
    # Per-job log calls cost even when filtered (the keyword dict is built):
    # skip them when the application's structlog level drops them anyway.
    check = getattr(log, "is_enabled_for", None)
    return True if check is None else bool(check(level))


def _debug_enabled() -> bool:
    return _enabled(logging.DEBUG)


def _info_enabled() -> bool:
    return _enabled(logging.INFO)


# Why a running job's task was cancelled by us (as opposed to by the job itself).
CANCELLED_REMOTELY = "cancelled"  # cancel_job(): the row is already 'cancelled'
LEASE_LOST = "lease lost"  # the database no longer has it running here
SHUTDOWN = "shutdown"  # graceful shutdown ran out of grace: hand it back


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
        )


@dataclass(slots=True)
class RunningJob:
    job: ClaimedJob
    task: asyncio.Task[Any]
    claimed_at: float
    cancel_reason: str | None = None


class AckBatcher:
    """Group commit for completions: one UPDATE for everything that finished meanwhile.

    A completion waits for the flush in flight, never for a timer, so an idle
    worker writes each completion at once and a busy one writes hundreds per
    statement. A flush that hits a lost connection is retried until it lands;
    the lease guard makes the retry harmless.
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
        self._queue: list[tuple[Completion, asyncio.Future[bool]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._unwritten = 0
        self.connection = HeldConnection(store.pool)

    def _written(self, _future: asyncio.Future[bool]) -> None:
        self._unwritten -= 1

    @property
    def pending(self) -> int:
        """Completions queued or being written."""
        return self._unwritten

    async def submit(self, completion: Completion) -> bool:
        """Queue a completion; True once written, False if the lease was already lost."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._unwritten += 1
        future.add_done_callback(self._written)
        self._queue.append((completion, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_all())
        # No shield needed: a cancelled waiter leaves its completion queued and written.
        return await future

    async def _flush_all(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            try:
                written = await retry_on_disconnect(
                    lambda b=batch: self.connection.run(
                        lambda db: self._store.complete(
                            self._worker_id, [c for c, _ in b], self._delete_completed(), db
                        )
                    ),
                    what="complete",
                )
            except BaseException as exc:
                # A bug, or shutdown gave up during an outage: the rows stay
                # 'running' and will be rescued, so nothing is lost.
                log.error("writing completions failed", error=repr(exc), jobs=len(batch))
                for _, future in batch:
                    if not future.done():
                        future.set_exception(ConnectionError(f"completion not written: {exc!r}"))
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for completion, future in batch:
                if not future.done():
                    future.set_result(completion.job_id in written)

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
            for _, future in self._queue:
                if not future.done():
                    future.set_exception(ConnectionError("completion not written at shutdown"))
            log.error(
                "completions not written before shutdown; their jobs will be rescued and run again",
                jobs=len(self._queue),
            )


class Worker:
    """Claims, runs and settles jobs for one Scheduler."""

    def __init__(
        self,
        *,
        store: Store,
        registry: TaskRegistry,
        worker_id: str,
        max_concurrent_jobs: int,
        batch_claim_limit: int,
        polling: PollingConfig,
        lease_seconds: Callable[[], float],
        job_timeout: float | None,
        retry_policy: RetryPolicy,
        delete_completed: Callable[[], bool],
        notifications_live: Callable[[], bool],
    ) -> None:
        self.store = store
        self.registry = registry
        self.worker_id = worker_id
        self.max_concurrent_jobs = max_concurrent_jobs
        self.batch_claim_limit = batch_claim_limit
        self.polling = polling
        self.lease_seconds = lease_seconds
        self.job_timeout = job_timeout
        self.retry_policy = retry_policy
        self.notifications_live = notifications_live
        self.semaphore = asyncio.Semaphore(max_concurrent_jobs)
        self.acks = AckBatcher(store, worker_id, delete_completed)
        self.running: dict[str, RunningJob] = {}
        # Claimed here and not yet settled (queued, running, or awaiting its write).
        self.owned: set[str] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        # Claims sent and not answered yet, and claims ever sent: the heartbeat
        # tells a claim whose answer was lost from one still in flight by them.
        self.claims_in_flight = 0
        self.claims_sent = 0
        self._in_flight = 0
        # Jobs holding a semaphore slot: freed when the function returns, not
        # when its outcome is written, so the next job starts during the write.
        self._slots: set[str] = set()
        # Unwritten completions beyond this stop the claim loop (memory stays bounded).
        self.max_pending_acks = max(1000, 4 * max_concurrent_jobs)
        # Claim ahead: up to one batch waits locally for a slot, so the next
        # claim overlaps the running jobs. While every slot is busy, claim only
        # once half a batch has room (no one-row claims).
        self.prefetch = min(batch_claim_limit, max_concurrent_jobs)
        self._min_claim = max(1, self.prefetch // 2)
        # Claimed-ahead rows waiting for a slot (no task yet), with the time they arrived.
        self._buffer: deque[tuple[float, Mapping[str, Any]]] = deque()
        # Claimed jobs started (each holds, or is about to take, a semaphore slot).
        self._active = 0
        # Rows that wait longer than this for a slot are handed back (long jobs:
        # claiming ahead would only keep them from idle workers), and claiming
        # ahead pauses for a while.
        self.max_buffer_wait = 1.0
        self._prefetch_paused_until = 0.0
        self._log_debug = self._log_info = True
        self._wake = asyncio.Event()
        self._capacity = asyncio.Event()
        self._claiming = True
        self._force = asyncio.Event()
        self._retry_timer: asyncio.TimerHandle | None = None
        # The claim loop's own connection (claims and next-due probes). Claims
        # commit asynchronously: a claim a database crash forgets leaves its job
        # pending, to run again, and any later synchronous commit (the job's
        # completion) flushes the claim first. Saves the WAL flush, about a
        # third of a claim's time here.
        self.connection = HeldConnection(store.pool, asynchronous_commit=True)

    # -- claim loop --------------------------------------------------------

    def wake(self) -> None:
        """Look for due jobs now (a NOTIFY arrived, a task was registered, ...)."""
        self._wake.set()

    def stop_claiming(self) -> None:
        self._claiming = False
        self._wake.set()
        self._capacity.set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def run(self) -> None:
        try:
            await self._claim_loop()
        finally:
            await self.connection.release()

    async def _claim_loop(self) -> None:
        idle_wait = self.polling.idle_start_interval
        errors = Backoff(initial=0.1, maximum=5.0)
        while self._claiming:
            if self._buffer:
                await self._hand_back_stale()
            prefetch = self.prefetch if time.monotonic() >= self._prefetch_paused_until else 0
            free = self.max_concurrent_jobs + prefetch - self._in_flight
            slots_idle = self._in_flight < self.max_concurrent_jobs
            if (
                free <= 0
                or (free < self._min_claim and not slots_idle)
                or self.acks.pending >= self.max_pending_acks
            ):
                self._capacity.clear()
                await self._wait(self._capacity, self.polling.semaphore_full_interval)
                continue
            limit = min(free, self.batch_claim_limit)
            self._wake.clear()
            try:
                names = self.registry.names()
                self.claims_in_flight += 1
                self.claims_sent += 1
                try:
                    rows = await self.connection.run(
                        partial(
                            self.store.claim, self.worker_id, names, limit, self.lease_seconds()
                        )
                    )
                finally:
                    self.claims_in_flight -= 1
                if len(rows) >= limit:
                    self.dispatch(rows)
                    idle_wait = self.polling.idle_start_interval
                    continue
                self.dispatch(rows)
                due_in = await self.connection.run(
                    partial(self.store.seconds_until_next_due, names)
                )
            except Exception as exc:
                level = log.warning if is_connection_error(exc) else log.exception
                level("claim failed", worker_id=self.worker_id, error=repr(exc))
                await self._wait(self._wake, errors.next_delay())
                continue
            errors.reset()
            if rows:
                idle_wait = self.polling.idle_start_interval
            await self._wait(self._wake, self._idle_timeout(due_in, bool(rows), idle_wait))
            if not self.notifications_live():
                idle_wait = min(
                    idle_wait * self.polling.backoff_multiplier, self.polling.max_interval
                )

    def _idle_timeout(self, due_in: float | None, claimed_some: bool, idle_wait: float) -> float:
        # With live notifications, sleep until the next due job (a NOTIFY
        # wakes us sooner); max_interval bounds the sleep as a safety net.
        # Without them, poll with backoff.
        ceiling = self.polling.max_interval if self.notifications_live() else idle_wait
        if due_in is None:
            return ceiling
        if due_in <= 0:
            # Due rows exist but were locked by other workers' claims: brief pause.
            return 0.0 if claimed_some else self.polling.min_interval
        return min(due_in, ceiling)

    @staticmethod
    async def _wait(event: asyncio.Event, timeout: float) -> None:
        if timeout <= 0:
            return
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass

    def dispatch(self, rows: list[Any]) -> None:
        """Start a task per claimed row; rows the claim expired are only logged."""
        self._check_log_levels()
        for row in sorted(rows, key=lambda r: (r["priority"], r["execution_time"])):
            if row["status"] == "expired":
                log.warning(
                    "job expired",
                    job_id=row["job_id"],
                    task=row["task_name"],
                    worker_id=self.worker_id,
                    attempt=row["attempts"],
                    event_type="expired",
                )
                continue
            self._in_flight += 1
            self._accept(row)

    def _check_log_levels(self) -> None:
        # Checked once per claim, not per job.
        self._log_debug = _debug_enabled()
        self._log_info = _info_enabled()

    def _accept(self, row: Mapping[str, Any], local: bool = False) -> None:
        """A row claimed here (counted in flight): start it, or keep it for a slot."""
        if self._log_debug:
            log.debug(
                "job claimed",
                event_type="claimed",
                job_id=row["job_id"],
                task=row["task_name"],
                worker_id=self.worker_id,
                attempt=row["attempts"],
                **({"local": True} if local else {}),
            )
        self.owned.add(row["job_id"])
        if self._active < self.max_concurrent_jobs:
            self._start(row)
        else:
            self._buffer.append((time.monotonic(), row))

    # -- jobs enqueued in this process, started here -------------------------

    def reserve_local_start(self) -> bool:
        """Hold a free slot for a due job this process is enqueueing. It counts as
        a claim in flight, so the heartbeat hands the row back if the insert's
        answer is lost."""
        if not self._claiming or self._in_flight >= self.max_concurrent_jobs:
            return False
        self._in_flight += 1
        self.claims_in_flight += 1
        self.claims_sent += 1
        return True

    def finish_local_start(self, row: Mapping[str, Any] | None) -> bool:
        """Start the inserted row if it came back running here; else free the slot."""
        self.claims_in_flight -= 1
        if row is not None and row["status"] == "running":
            self._check_log_levels()
            self._accept(row, local=True)
            return True
        self._in_flight = max(0, self._in_flight - 1)
        self._capacity.set()
        return False

    def _start(self, row: Mapping[str, Any]) -> None:
        self._active += 1
        task = asyncio.create_task(self._run_claimed(row))
        self.tasks.add(task)
        task.add_done_callback(self._job_task_done)

    async def _hand_back_stale(self) -> None:
        if self._buffer and time.monotonic() - self._buffer[0][0] > self.max_buffer_wait:
            self._prefetch_paused_until = time.monotonic() + 30.0
            await self.hand_back_buffer()

    async def hand_back_buffer(self) -> None:
        """Return every claimed-ahead row that has not started (one statement)."""
        if not self._buffer:
            return
        ids = [row["job_id"] for _, row in self._buffer]
        self._buffer.clear()
        try:
            await self._release(ids)
        finally:
            for job_id in ids:
                self.owned.discard(job_id)
            self._in_flight = max(0, self._in_flight - len(ids))
            self._capacity.set()

    def _job_task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("job task crashed", error=repr(task.exception()))

    # -- execution ------------------------------------------------------------

    async def execute_job_with_concurrency_control(self, job_row: Mapping[str, Any]) -> None:
        """Run one claimed job under the concurrency semaphore.

        The slot is freed as soon as the function returns (see :meth:`_free_slot`);
        the job stays owned until its outcome is written.
        """
        try:
            async with self.semaphore:
                await self.execute_job(job_row)
        finally:
            self.owned.discard(job_row["job_id"])
            self._in_flight = max(0, self._in_flight - 1)
            self._capacity.set()

    async def _run_claimed(self, job_row: Mapping[str, Any]) -> None:
        # Started only when a slot is free, so the acquire does not wait (an
        # asyncio.Semaphore with many waiters costs O(waiters) per acquire).
        job_id = job_row["job_id"]
        try:
            await self.semaphore.acquire()
            self._slots.add(job_id)
            await self.execute_job(job_row)
        finally:
            if job_id in self._slots:
                self._free_slot(job_id)
            else:  # cancelled before it had its slot
                self._active -= 1
                self._in_flight = max(0, self._in_flight - 1)
            self.owned.discard(job_id)
            self._capacity.set()

    def _free_slot(self, job_id: str) -> None:
        """The job's function has returned: let the next job run while its outcome is written."""
        if job_id in self._slots:
            self._slots.discard(job_id)
            self.semaphore.release()
            self._active -= 1
            self._in_flight = max(0, self._in_flight - 1)
            self._capacity.set()
            if self._buffer and self._claiming:
                self._start(self._buffer.popleft()[1])

    async def execute_job(self, job_row: Mapping[str, Any]) -> None:
        """Run a claimed job and record its outcome under the lease guard."""
        job = ClaimedJob.from_row(job_row)
        func = self.registry.resolve(job.task_name)
        if func is None:
            # We claim only registered names, so this is a race with a
            # registry change; hand it back rather than fail it.
            log.warning(
                "no function registered for claimed job, releasing it",
                job_id=job.job_id,
                task=job.task_name,
            )
            await self._release([job.job_id])
            return
        current = asyncio.current_task()
        assert current is not None
        running = RunningJob(job, current, time.monotonic())
        self.running[job.job_id] = running
        started = time.perf_counter()
        timeout = job.timeout if job.timeout is not None else self.job_timeout
        if self._log_debug:
            log.debug("job started", event_type="started", **self._fields(job))
        timer = None
        try:
            args, kwargs = decode_task_data(job.task_data)
            if timeout is None:
                result = await func(*args, **kwargs)
            else:
                async with asyncio.timeout(timeout) as timer:
                    result = await func(*args, **kwargs)
        except asyncio.CancelledError:
            reason = running.cancel_reason
            if reason is None and current.cancelling():
                raise  # the worker itself is being torn down
            if reason is None:
                # Raised by the job's own code (it awaited something that was
                # cancelled): a failed attempt like any other exception. Left
                # to propagate, the row would stay running here, be handed
                # back and run again, forever.
                self.running.pop(job.job_id, None)
                self._free_slot(job.job_id)
                message = "CancelledError: raised inside the job (not a cancel_job())"
                duration = time.perf_counter() - started
                await self._failed(job, message, tb.format_exc(), duration)
                return
            current.uncancel()
            self.running.pop(job.job_id, None)
            duration = time.perf_counter() - started
            if reason == SHUTDOWN:
                await self._release([job.job_id])
                log.info(
                    "job handed back at shutdown",
                    event_type="released",
                    duration=duration,
                    **self._fields(job),
                )
            else:
                log.info(
                    "job stopped",
                    event_type="cancelled",
                    reason=reason,
                    duration=duration,
                    **self._fields(job),
                )
            return
        except Exception as exc:
            self.running.pop(job.job_id, None)
            self._free_slot(job.job_id)
            duration = time.perf_counter() - started
            if timer is not None and timer.expired():
                message = f"timed out after {timeout:g} s"
            else:
                message = f"{type(exc).__name__}: {exc}"
            await self._failed(job, message, tb.format_exc(), duration)
            return
        self.running.pop(job.job_id, None)
        self._free_slot(job.job_id)
        duration = time.perf_counter() - started
        encoded, note = encode_result(result)
        if note:
            log.warning(note, **self._fields(job))
        try:
            written = await self.acks.submit(Completion(job.job_id, job.attempt, encoded))
        except Exception as exc:
            log.error(
                "completion not written; the job will be rescued and run again",
                error=repr(exc),
                **self._fields(job),
            )
            return
        if written:
            if self._log_info:
                log.info(
                    "job completed", event_type="completed", duration=duration, **self._fields(job)
                )
        else:
            log.warning(
                "job finished but its lease was lost; outcome not written",
                event_type="lease_lost",
                duration=duration,
                **self._fields(job),
            )

    def _fields(self, job: ClaimedJob) -> dict[str, Any]:
        """What every log line about a job carries (built only when one is written)."""
        return {
            "job_id": job.job_id,
            "task": job.task_name,
            "worker_id": self.worker_id,
            "attempt": job.attempt,
        }

    async def _failed(self, job: ClaimedJob, message: str, trace: str, duration: float) -> None:
        if job.attempt <= job.max_retries:
            stored = decode_json(job.retry_policy)
            policy = RetryPolicy(**stored) if stored else self.retry_policy
            delay = policy.delay_for(job.retry_count + 1)
            retry_at = await retry_on_disconnect(
                lambda: self.store.retry(
                    job.job_id, self.worker_id, job.attempt, delay, message, trace
                ),
                what="retry",
            )
            if retry_at is not None:
                self._wake_after(delay)
                log.warning(
                    "job failed, will retry",
                    event_type="retried",
                    error=message,
                    retry_in=round(delay, 3),
                    duration=duration,
                    **self._fields(job),
                )
                return
        else:
            written = await retry_on_disconnect(
                lambda: self.store.fail(job.job_id, self.worker_id, job.attempt, message, trace),
                what="fail",
            )
            if written:
                log.error(
                    "job failed",
                    event_type="failed",
                    error=message,
                    duration=duration,
                    **self._fields(job),
                )
                return
        log.warning(
            "job failed but its lease was lost; outcome not written",
            event_type="lease_lost",
            error=message,
            **self._fields(job),
        )

    def _wake_after(self, delay: float) -> None:
        # The retry is due later; make sure this worker looks again then.
        loop = asyncio.get_running_loop()
        if self._retry_timer is not None and self._retry_timer.when() <= loop.time() + delay:
            return
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        self._retry_timer = loop.call_later(delay, self.wake)

    async def _release(self, job_ids: list[str]) -> list[str]:
        return await retry_on_disconnect(
            lambda: self.store.release(self.worker_id, job_ids), what="release", give_up_after=30
        )

    # -- cancellation and shutdown --------------------------------------------

    def cancel_local(self, job_id: str, reason: str) -> bool:
        """Cancel the task running ``job_id`` here, if any."""
        running = self.running.get(job_id)
        if running is None:
            return self._drop_buffered(job_id)
        if running.cancel_reason is not None:
            return False
        running.cancel_reason = reason
        running.task.cancel()
        return True

    def _drop_buffered(self, job_id: str) -> bool:
        # A claimed-ahead row cancelled (or lost) before it started: never start it.
        for entry in self._buffer:
            if entry[1]["job_id"] == job_id:
                self._buffer.remove(entry)
                self.owned.discard(job_id)
                self._in_flight = max(0, self._in_flight - 1)
                self._capacity.set()
                return True
        return False

    def force_shutdown(self) -> None:
        """Cut the grace period short: running jobs are handed back now."""
        self._force.set()

    async def drain(self, grace_period: float) -> None:
        """Wait up to ``grace_period`` for running jobs, then cancel and hand back the rest."""
        # Claimed ahead but not started: back to pending at once, for other workers.
        try:
            await self.hand_back_buffer()
        except Exception as exc:
            log.warning(
                "could not hand back claimed-ahead jobs; they will be rescued", error=repr(exc)
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_period
        while self.tasks and not self._force.is_set() and loop.time() < deadline:
            forced = asyncio.create_task(self._force.wait())
            await asyncio.wait(
                {*self.tasks, forced},
                timeout=deadline - loop.time(),
                return_when=asyncio.FIRST_COMPLETED,
            )
            forced.cancel()
        if self.tasks:
            for job_id in list(self.running):
                self.cancel_local(job_id, SHUTDOWN)
            _, stubborn = await asyncio.wait(set(self.tasks), timeout=10.0)
            if stubborn:
                log.error(
                    "jobs ignored cancellation; their leases will expire and they will be rescued",
                    jobs=len(stubborn),
                )
        await self.acks.drain()
        await self.acks.connection.release()
        if self._retry_timer is not None:
            self._retry_timer.cancel()
