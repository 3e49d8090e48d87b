"""The claimer: the claim loop, the claimed-ahead buffer and each job's task.

The claim loop asks for up to what :class:`~.slots.Slots` allows in one
statement; each claimed row starts in its own task when a slot is free (the
rest wait in the buffer, marked claimed ahead), and the :class:`~.executor.Executor`
runs it; completions go through the :class:`~.completer.Completer`. Every write
out of ``running`` carries the lease guard (worker id + attempt), so a worker
that lost a job to the rescuer can never overwrite what happened to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..config import PollingConfig, RetryPolicy
from ..reconnect import Backoff, is_connection_error, retry_on_disconnect
from ..store import Store
from ..tasks import TaskRegistry
from .claim_events import ClaimEvents
from .completer import Completer
from .executor import LEASE_LOST, SHUTDOWN, Executor, log
from .held import HeldConnection
from .slots import Slots


@dataclass(slots=True)
class Holdings:
    """What a worker holds, as the heartbeat needs it before its statement."""

    claims_sent: int
    quiet: bool  # no claim in flight: every claim it can see was answered
    started_ahead: list[str]  # claimed-ahead rows started since the last heartbeat


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
        asynchronous_commit: bool = True,
        thread_pool_size: int = 10,
        process_pool_size: int | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.worker_id = worker_id
        self.polling = polling
        self.lease_seconds = lease_seconds
        self.job_timeout = job_timeout
        self.retry_policy = retry_policy
        self.notifications_live = notifications_live
        self.slots = slots = Slots(max_concurrent_jobs, batch_claim_limit)
        self.semaphore = slots.semaphore
        self.completer = Completer(store, worker_id, delete_completed)
        self.executor = Executor(
            store=store,
            registry=registry,
            worker_id=worker_id,
            job_timeout=job_timeout,
            retry_policy=retry_policy,
            complete=self.completer.submit,
            free_slot=self._free_slot,
            release=self._release,
            wake_after=self._wake_after,
            thread_pool_size=thread_pool_size,
            process_pool_size=process_pool_size,
        )
        self._execute = self.executor.execute_job
        # The executor's: jobs whose function runs now, by id.
        self.running = self.executor.running
        # Claimed here and not yet settled (queued, running, or awaiting its write).
        self.owned: set[str] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        # Claims sent and not answered yet, and claims ever sent: the heartbeat
        # tells a claim whose answer was lost from one still in flight by them.
        self.claims_in_flight = 0
        self.claims_sent = 0
        # Rows the claim marked claimed ahead that have started since the last
        # heartbeat, which tells the database (see store._HEARTBEAT).
        self.started_ahead: list[str] = []
        # Rows that wait longer than this for a slot are handed back (long jobs:
        # claiming ahead would only keep them from idle workers), and claiming
        # ahead pauses for a while.
        self.max_buffer_wait = 1.0
        self._wake = asyncio.Event()
        #: False once shutdown began: nothing new is claimed or started.
        self.claiming = True
        self._force = asyncio.Event()
        self._retry_timer: asyncio.TimerHandle | None = None
        # The claim loop's own connection (claims and next-due probes). Claims
        # commit asynchronously: a claim a database crash forgets leaves its job
        # pending, to run again, and any later synchronous commit (the job's
        # completion) flushes the claim first. Saves the WAL flush, about a
        # third of a claim's time here. Not behind pgbouncer: a SET there stays
        # on the server connection and reaches other clients.
        self.connection = HeldConnection(store.pool, asynchronous_commit=asynchronous_commit)
        self.claim_events = ClaimEvents(store, worker_id)

    # -- claim loop --------------------------------------------------------

    def wake(self) -> None:
        """Look for due jobs now (a NOTIFY arrived, a task was registered, ...)."""
        self._wake.set()

    def stop_claiming(self) -> None:
        self.claiming = False
        self._wake.set()
        self.slots.changed.set()

    @property
    def in_flight(self) -> int:
        """Rows this worker holds running in the database."""
        return self.slots.held

    async def warm_up(self) -> None:
        """Take the claim loop's connection and prepare the claim on it.

        Run while start() checks the schema: a pooled connection's first
        statement with an array type makes asyncpg look the types up (~10 ms on
        a new server connection), and the claim's first parse opens the jobs
        table and its indexes; done here, neither delays the first claim (nor
        does reading the event flags). Best effort (the schema may not exist
        yet): errors are ignored."""

        async def warm(db: Any) -> None:
            await db.prepare(self.store._claim)
            await self.claim_events.read_flags(db)

        try:
            await self.connection.run(warm)
        except Exception as exc:
            log.debug("claim warm-up failed", error=repr(exc))

    async def run(self) -> None:
        try:
            await self._claim_loop()
        finally:
            await self.connection.release()

    async def _claim_loop(self) -> None:
        idle_wait = self.polling.idle_start_interval
        errors = Backoff(initial=0.1, maximum=5.0)
        slots = self.slots
        while self.claiming:
            if slots.buffer:
                await self._hand_back_stale()
            limit = slots.claim_limit(self.completer.pending)
            if limit <= 0:
                slots.changed.clear()
                await self._wait(slots.changed, self.polling.semaphore_full_interval)
                continue
            self._wake.clear()
            try:
                names = self.registry.names()
                self.claims_in_flight += 1
                self.claims_sent += 1
                try:
                    # Rows past the free slots wait here: the claim marks
                    # them claimed ahead (a rescue of one that never started
                    # does not count against max_rescues).
                    rows = await self.connection.run(
                        partial(
                            self.store.claim,
                            self.worker_id,
                            names,
                            limit,
                            self.lease_seconds(),
                            start_now=slots.start_now(),
                        )
                    )
                finally:
                    self.claims_in_flight -= 1
                if rows:
                    await self._send_claim_events(rows)
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

    async def _send_claim_events(self, rows: list[Any]) -> None:
        # Never keeps claimed rows from starting: events are at most once.
        try:
            await self.connection.run(partial(self.claim_events.send, rows=rows))
        except Exception as exc:
            log.warning("could not send the claim's events", error=repr(exc))

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
        self.executor.check_log_levels()
        # The order the claim placed them in: those it did not mark claimed ahead first.
        key = lambda r: (r.get("claimed_ahead") or False, r["priority"], r["execution_time"])  # noqa: E731
        for row in sorted(rows, key=key):
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
            self.slots.held += 1
            self.accept(row)

    def accept(self, row: Mapping[str, Any], local: bool = False) -> None:
        """A row claimed here (counted in flight): start it, or keep it for a slot."""
        if self.executor.log_debug:
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
        # After stop_claiming nothing new starts: drain() hands the buffer back.
        slots = self.slots
        if slots.active < slots.max_running and self.claiming:
            self._start(row)
        else:
            slots.buffer.append((time.monotonic(), row))

    def _start(self, row: Mapping[str, Any]) -> None:
        job_id = row["job_id"]
        slots = self.slots
        slots.active += 1
        slots.taken[job_id] = False
        if row.get("claimed_ahead"):
            self.started_ahead.append(job_id)
        task = asyncio.create_task(self._run_claimed(row))
        self.tasks.add(task)
        task.add_done_callback(partial(self._job_task_done, job_id))

    async def _hand_back_stale(self) -> None:
        buffer = self.slots.buffer
        if buffer and time.monotonic() - buffer[0][0] > self.max_buffer_wait:
            self.slots.pause_prefetch(30.0)
            await self.hand_back_buffer()

    async def hand_back_buffer(self) -> None:
        """Return every claimed-ahead row that has not started (one statement)."""
        buffer = self.slots.buffer
        if not buffer:
            return
        ids = [row["job_id"] for _, row in buffer]
        buffer.clear()
        try:
            await self._release(ids)
        finally:
            for job_id in ids:
                self.owned.discard(job_id)
            self.slots.let_go(len(ids))

    def _job_task_done(self, job_id: str, task: asyncio.Task[Any]) -> None:
        # Runs exactly once per started job, even for a task cancelled before
        # its first step (whose finally blocks never run).
        self.tasks.discard(task)
        self._free_slot(job_id)
        self.owned.discard(job_id)
        self.slots.let_go()
        if not task.cancelled() and task.exception() is not None:
            log.error("job task crashed", error=repr(task.exception()))

    # -- running claimed jobs (the executor runs each one) -----------------------

    async def execute_job_with_concurrency_control(self, job_row: Mapping[str, Any]) -> None:
        """Run one claimed job under the concurrency semaphore.

        The slot is freed as soon as the function returns (see :meth:`_free_slot`);
        the job stays owned until its completion (or failure) is written.
        """
        self.slots.held += 1
        try:
            async with self.semaphore:
                await self._execute(job_row)
        finally:
            self.owned.discard(job_row["job_id"])
            self.slots.let_go()

    async def _run_claimed(self, job_row: Mapping[str, Any]) -> None:
        # Started only when a slot is free, so the acquire does not wait (an
        # asyncio.Semaphore with many waiters costs O(waiters) per acquire).
        # The accounting is _free_slot's and _job_task_done's alone.
        job_id = job_row["job_id"]
        slots = self.slots
        await slots.semaphore.acquire()
        if job_id in slots.taken:
            slots.taken[job_id] = True
        else:  # freed meanwhile (cannot happen today): keep the semaphore balanced
            slots.semaphore.release()
            return
        await self._execute(job_row)

    def _free_slot(self, job_id: str) -> None:
        """The job's function has returned: let the next job run while its completion is written.

        Idempotent: the first call gives back the slot and the start; later calls do nothing."""
        slots = self.slots
        held = slots.taken.pop(job_id, None)
        if held is None:
            return
        if held:
            slots.semaphore.release()
        slots.active -= 1
        slots.changed.set()
        if slots.buffer and self.claiming:
            self._start(slots.buffer.popleft()[1])

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
        buffer = self.slots.buffer
        for entry in buffer:
            if entry[1]["job_id"] == job_id:
                buffer.remove(entry)
                self.owned.discard(job_id)
                self.slots.let_go()
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
        await self.completer.drain()
        await self.completer.connection.release()
        if self._retry_timer is not None:
            self._retry_timer.cancel()

    # -- what the heartbeat asks ---------------------------------------------

    def holdings(self) -> Holdings:
        """Before a heartbeat: the claim counters, and the claimed-ahead rows that
        started since the last one (taken; give them back with :meth:`unreported`)."""
        started_ahead, self.started_ahead = self.started_ahead, []
        return Holdings(self.claims_sent, self.claims_in_flight == 0, started_ahead)

    def unreported(self, holdings: Holdings) -> None:
        """The heartbeat failed: report these starts with the next one."""
        self.started_ahead[:0] = holdings.started_ahead

    def reconcile(
        self,
        held: Mapping[str, Mapping[str, Any]],
        holdings: Holdings,
        sent_at: float,
        ghost_grace: float,
        lease_lost: Callable[[str], None],
    ) -> list[str]:
        """After a heartbeat: stop jobs whose rows the database no longer has running
        here (``lease_lost`` is told each), and return the rows held there that no
        task here owns (ghosts: a claim whose answer was lost) to hand back."""
        for job_id, running in list(self.running.items()):
            if job_id not in held and running.claimed_at < sent_at:
                if self.cancel_local(job_id, LEASE_LOST):
                    lease_lost(job_id)
        # No claim overlapped the heartbeat: every claim it can see was answered
        # before it was sent, so a row not owned here is a ghost now (after a
        # database restart, say), without waiting for the grace.
        settled = holdings.quiet and self.claims_sent == holdings.claims_sent
        return [
            job_id
            for job_id, r in held.items()
            if job_id not in self.owned and (settled or (r["running_for"] or 0) > ghost_grace)
        ]
