"""The claimer: the claim loop, and the worker that ties the engine together.

The claim loop asks for up to what :class:`~.slots.Slots` allows in one
statement and dispatches the rows: each starts in its own task when a slot is
free, the rest wait in the buffer, marked claimed ahead (:class:`~.starts.Starts`);
the :class:`~.executor.Executor` runs it; completions go through the
:class:`~.completer.Completer`; :class:`~.handback.HandBack` gives rows back;
:class:`~.holdings.HeartbeatView` answers the heartbeat. The parts share one
:class:`~.state.WorkerState`. Every write out of ``running`` carries the
lease guard (worker id + attempt), so a worker that lost a job to the rescuer
can never overwrite what happened to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from ..config import PollingConfig, RetryPolicy
from ..store import Store
from ..support.reconnect import Backoff, is_connection_error, retry_on_disconnect
from ..tasks import TaskRegistry
from .batch import Batches
from .claim_events import ClaimEvents
from .completer import Completer
from .executor import Executor, log
from .fair import FairClaims
from .hand_off import HandOff
from .handback import HandBack
from .heads import ClaimHeads
from .held import HeldConnection
from .holdings import HeartbeatView
from .keyed import KeyedClaims
from .limited import LimitedClaims
from .slots import Slots
from .starts import Starts
from .state import WorkerState
from .waits import wait_either, wait_on


class Worker:
    """Claims, runs and settles jobs for one Scheduler: the claim loop, and the
    parts it holds (``slots``, ``starts``, ``executor``, ``completer``,
    ``handback``, ``heartbeat_view``, ``limits``, ``claim_events``), which share
    ``state``."""

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
        served: list[str] | None = None,
        queue_limits: Mapping[str, int] | None = None,
        max_rescues: int = 3,
    ) -> None:
        self.store = store
        self.registry = registry
        self.worker_id = worker_id
        self.polling = polling
        self.lease_seconds = lease_seconds
        self.job_timeout = job_timeout
        self.retry_policy = retry_policy
        self.notifications_live = notifications_live
        self.state = state = WorkerState()
        self.slots = slots = Slots(max_concurrent_jobs, batch_claim_limit, served, queue_limits)
        slots.on_queue_room = self.wake
        self.semaphore = slots.semaphore
        self.completer = Completer(store, worker_id, delete_completed)
        # The executor reports back to the starts, which need it to run jobs:
        # its callbacks are the worker's, which pass them on.
        self.executor = Executor(
            store=store,
            registry=registry,
            worker_id=worker_id,
            job_timeout=job_timeout,
            retry_policy=retry_policy,
            complete=self.completer.submit,
            queue=self.completer.queue,
            free_slot=self._free_slot,
            settled=self._settled,
            release=self._release,
            wake_after=self._wake_after,
            thread_pool_size=thread_pool_size,
            process_pool_size=process_pool_size,
            max_rescues=max_rescues,
        )
        # The executor's: jobs whose function runs now, by id.
        self.running = self.executor.running
        self.handback = HandBack(
            state=state,
            slots=slots,
            store=store,
            worker_id=worker_id,
            running=self.running,
            completer=self.completer,
            release=self._release,
            wake=self.wake,
        )
        self.starts = Starts(
            state=state,
            slots=slots,
            executor=self.executor,
            worker_id=worker_id,
            queue_paused=self.handback.queue_paused,
        )
        self.heartbeat_view = HeartbeatView(state, self.running, self.handback.cancel_local)
        # A completion takes over the dependents it releases (engine/hand_off.py).
        self.completer.hand_off = HandOff(
            state=state,
            slots=slots,
            names=lambda: self.batches.plain(self.registry.names()),
            lease_seconds=lease_seconds,
            dispatch=self.dispatch,
            release=self._release,
        )
        self._wake = asyncio.Event()
        self._retry_timer: asyncio.TimerHandle | None = None
        # The claim loop's own connection (claims and next-due probes). Claims
        # commit asynchronously: a claim a database crash forgets leaves its job
        # pending, to run again, and any later synchronous commit (the job's
        # completion) flushes the claim first. Saves the WAL flush, about a
        # third of a claim's time here. Not behind pgbouncer: a SET there stays
        # on the server connection and reaches other clients.
        self.connection = HeldConnection(store.pool, asynchronous_commit=asynchronous_commit)
        # Global limits: limited tasks and queues are claimed apart (engine/limited.py).
        self.limits = LimitedClaims(store.limits, self.executor.rate_starts)
        # Jobs with a concurrency key: claimed apart (engine/keyed.py).
        self.keyed = KeyedClaims(store.keys, self.executor.rate_starts)
        # The next claim is the plain one even while limits exist (a limited
        # claim just came back short).
        self._plain_next = False
        self.claim_events = ClaimEvents(store, worker_id)
        # Batch tasks: claimed and run apart from the plain claim (engine/batch.py).
        self.batches = Batches(
            store=store,
            registry=registry,
            worker_id=worker_id,
            state=state,
            slots=slots,
            executor=self.executor,
            completer=self.completer,
            claim_events=self.claim_events,
            free_slot=self._free_slot,
            release=self._release,
            lease_seconds=lease_seconds,
            polling=polling,
            asynchronous_commit=asynchronous_commit,
        )
        # Fair share: while keyed rows are pending, claims are fair (engine/fair.py).
        self.fair = FairClaims(store.fair)
        # Where the plain claim starts reading each group (engine/heads.py).
        self.heads = ClaimHeads(partial(store.group_heads, store.pool))

    # -- claim loop --------------------------------------------------------

    def wake(self) -> None:
        """Look for due jobs now (a NOTIFY arrived, a task was registered, ...)."""
        self._wake.set()
        self.batches.wake()

    def stop_claiming(self) -> None:
        self.state.claiming = False
        self._wake.set()
        self.batches.wake()
        self.slots.changed.set()

    @property
    def in_flight(self) -> int:
        """Rows this worker holds running in the database."""
        return self.slots.held

    def prepare_start(self) -> None:
        """Ready to claim, also after a shutdown: claiming again, and the claim
        loop, the completion writer and the batch flusher keep their
        connections between statements again (the shutdown released them)."""
        self.state.claiming = True
        for held in (self.connection, self.completer.connection, self.batches.connection):
            held.hold()

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
        self.batches.start()
        heads = asyncio.create_task(self.heads.keep(self._served, lambda: self.state.claims_sent))
        try:
            await self._claim_loop()
        finally:
            heads.cancel()
            await asyncio.gather(heads, return_exceptions=True)
            await self.batches.stop()
            await self.connection.release()

    def _served(self) -> tuple[list[str], list[str] | None]:
        """The task names and queues the plain claim serves."""
        return self.batches.plain(self.registry.names()), self.slots.served

    async def _claim_loop(self) -> None:
        idle_wait = self.polling.idle_start_interval
        errors = Backoff(initial=0.1, maximum=5.0)
        slots = self.slots
        state = self.state
        while state.claiming:
            if slots.buffer:
                await self.handback.hand_back_stale()
            limit = slots.claim_limit(self.completer.pending)
            if limit <= 0:
                slots.changed.clear()
                await wait_on(slots.changed, self.polling.semaphore_full_interval)
                continue
            self._wake.clear()
            try:
                names = self.batches.plain(self.registry.names())
                await self.connection.run(self.limits.refresh)
                await self.connection.run(self.fair.refresh)
                # Room read after the await (an in-process start may have taken some).
                queues, caps = slots.claim_queues()
                limit = min(limit, slots.claim_limit(self.completer.pending))
                if self.keyed.active and slots.start_now() > 0:
                    # Keyed work at least as urgent as the due plain work first.
                    if await self._claim_apart(names, partial(self.keyed.claim, cut=True), True):
                        continue
                if self.keyed.seen:
                    # Keyed work as urgent waits for a slot: the plain claim
                    # takes only what starts now, none into the buffer ahead of it.
                    limit = min(limit, slots.start_now())
                    if limit <= 0:
                        slots.changed.clear()
                        await wait_either(
                            slots.changed, self._wake, self.polling.semaphore_full_interval
                        )
                        continue
                state.claims_in_flight += 1
                state.claims_sent += 1
                claim = state.claims_sent
                # While limits bind work it may claim, the plain claim leaves
                # the free slots and the buffer to due limited work more
                # urgent than its own (store/limits.py); not right after a
                # limited claim found less than that work seemed to offer
                # (its limits' room is read without their locks), so that a
                # wrong estimate can only slow unlimited work, never hold it back.
                limited = self.limits.applies(names, queues)
                beside = limited and not self._plain_next
                self._plain_next = False
                try:
                    # Rows past the free slots wait here: the claim marks
                    # them claimed ahead (a rescue of one that never started
                    # does not count against max_rescues).
                    if self.fair.active:
                        claim_with = self.store.fair.claim
                    elif beside:
                        claim_with = self.limits.store.claim_beside_limits
                    else:
                        claim_with = partial(self.store.claim, floors=self.heads.floors())
                    rows = await self.connection.run(
                        partial(
                            claim_with,
                            self.worker_id,
                            names,
                            limit,
                            self.lease_seconds(),
                            start_now=slots.start_now(),
                            queues=queues,
                            caps=caps,
                        )
                    )
                    # Still "in flight" until dispatched: the heartbeat must not
                    # take rows answered but not yet owned for ghosts.
                    if rows:
                        await self._send_claim_events(rows)
                finally:
                    state.claims_in_flight -= 1
                if not self.fair.active and not beside:
                    self.heads.claimed(rows)
                self.dispatch(rows, claim)
                if len(rows) >= limit:
                    idle_wait = self.polling.idle_start_interval
                    continue
                no_slot = False
                if slots.start_now() > 0 and await self._claim_apart(
                    names, partial(self.keyed.claim, cut=False), True
                ):
                    idle_wait = self.polling.idle_start_interval
                    continue
                if limited:
                    # Cleared before the free slots are read: a slot freed
                    # from here on ends the wait below.
                    slots.changed.clear()
                    if slots.start_now() > 0:
                        taken = await self._claim_apart(names, self.limits.claim)
                        if taken or (beside and self.limits.seen):
                            # Due work is left: the limited claim took what
                            # it could and the plain claim may have left less
                            # urgent rows; or it took nothing although the
                            # plain claim may have left the slots to it (the
                            # room was gone, another worker was first): claim
                            # again at once, uncut then.
                            if not taken:
                                self._plain_next = True
                            idle_wait = self.polling.idle_start_interval
                            continue
                    else:
                        no_slot = True
                due_in = await self.connection.run(
                    partial(
                        self.store.seconds_until_next_due,
                        names,
                        queues=queues,
                        floors=self.heads.floors(),
                    )
                )
                again, due_in = await self.fair.after_claim(
                    self.connection.run, bool(rows), due_in, names, queues
                )
                if again:
                    continue
            except Exception as exc:
                level = log.warning if is_connection_error(exc) else log.exception
                level("claim failed", worker_id=self.worker_id, error=repr(exc))
                await wait_on(self._wake, errors.next_delay())
                continue
            errors.reset()
            if rows:
                idle_wait = self.polling.idle_start_interval
            if no_slot and not rows and due_in is not None and due_in <= 0:
                # Due work waits for a slot here (limited work the plain claim
                # leaves the slots to): look again as soon as one frees, or a
                # job is enqueued (it may be more urgent: claimed ahead).
                await wait_either(slots.changed, self._wake, self.polling.semaphore_full_interval)
                continue
            await wait_on(self._wake, self._idle_timeout(due_in, bool(rows), idle_wait))
            if not self.notifications_live():
                idle_wait = min(
                    idle_wait * self.polling.backoff_multiplier, self.polling.max_interval
                )

    async def _claim_apart(
        self, names: list[str], claim: Callable[..., Any], ahead: bool = False
    ) -> list[Any]:
        """Jobs of limited tasks and queues, only as many as start at once
        (never claimed ahead: a buffered row would count against the limit,
        and start later than the rate window counted it); or keyed jobs
        (``ahead``: the claim decides which rows may wait in the buffer)."""
        slots = self.slots
        room = min(slots.start_now(), slots.batch_claim_limit)
        if ahead:
            room = slots.claim_limit(self.completer.pending)
            claim = partial(claim, start_now=slots.start_now())
        if room <= 0:
            return []
        queues, caps = slots.claim_queues()
        state = self.state
        state.claims_in_flight += 1
        state.claims_sent += 1
        number = state.claims_sent
        try:
            rows = await self.connection.run(
                partial(
                    claim,
                    names=names,
                    served=queues,
                    caps=caps,
                    room=room,
                    worker_id=self.worker_id,
                    lease_seconds=self.lease_seconds(),
                )
            )
            if rows:  # before they start, still in flight (see _claim_loop)
                await self._send_claim_events(rows)
        finally:
            state.claims_in_flight -= 1
        if claim == self.limits.claim and self.limits.tried and len(rows) < room:
            # Due limited work seemed to have room, and less was there.
            self._plain_next = True
        self.dispatch(rows, number)
        return rows

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

    def dispatch(self, rows: list[Any], claim: int | None = None) -> None:
        """Start a task per claimed row; rows the claim expired are only logged.
        ``claim``: the claim's number (``claims_sent`` when it was sent)."""
        self.executor.check_log_levels()
        if self.state.paused_queues and claim is not None:
            rows = self.handback.drop_paused(rows, claim)
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
            self.slots.hold(row)
            self.starts.accept(row)

    def _wake_after(self, delay: float) -> None:
        # The retry is due later; make sure this worker looks again then.
        loop = asyncio.get_running_loop()
        if self._retry_timer is not None and self._retry_timer.when() <= loop.time() + delay:
            return
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        self._retry_timer = loop.call_later(delay, self.wake)

    def cancel_local(self, job_id: str, reason: str) -> bool:
        """Cancel the task running ``job_id`` here (or drop its claimed-ahead row), if any."""
        return self.handback.cancel_local(job_id, reason)

    async def drain(self, grace_period: float) -> None:
        """Wait up to ``grace_period`` for running jobs, then cancel and hand back the
        rest (:meth:`HandBack.drain <.handback.HandBack.drain>`); no retry wake-up after."""
        await self.handback.drain(grace_period)
        if self._retry_timer is not None:
            self._retry_timer.cancel()

    # The executor's callbacks (built before the parts they reach).

    def _free_slot(self, job_id: str) -> None:
        self.starts.free_slot(job_id)

    def _settled(self, job_id: str) -> None:
        self.starts.settled(job_id)

    async def _release(self, job_ids: list[str]) -> list[str]:
        return await retry_on_disconnect(
            lambda: self.store.release(self.worker_id, job_ids), what="release", give_up_after=30
        )
