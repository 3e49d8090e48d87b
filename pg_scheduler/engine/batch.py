"""Batch tasks' claim loop: a part of :class:`~.claimer.Worker` (docs/batches.md).

The plain claim leaves batch tasks out (:meth:`Batches.plain`); this loop,
started once a batch task is registered, asks the database which queues have
a batch ready (``batch_size`` jobs due, or the earliest due job waited
``batch_timeout``: ``store/batches.py``, by the database's clock), takes one
slot, claims up to ``batch_size`` jobs of that task and queue with the
ordinary claim (``Store.claim``: leases, priority order, misfire expiry,
paused queues) and runs them as one :class:`~.batch_run.BatchRun`, which
records itself (its id, size and jobs) as it starts (migration 0020).

Slots: a batch takes ONE slot of ``max_concurrent_jobs`` (and counts as one
held row) for as long as its handler runs: a slot bounds concurrent calls of
functions, and the handler is called once. A worker thus runs at most
``max_concurrent_jobs`` handlers, batches or not; its rows are bounded by
``max_concurrent_jobs * max(batch_size)`` plus its claim-ahead.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from ..batching import BatchOptions, batch_options_of
from ..config import PollingConfig
from ..store import Store
from ..store.batches import BatchQueue, BatchStore
from ..support.reconnect import Backoff, is_connection_error
from ..tasks import EXECUTOR_ATTR, TaskRegistry
from .batch_run import BatchRun, Release
from .claim_events import ClaimEvents
from .completer import Completer
from .executor import Executor, log
from .held import HeldConnection
from .outcome import Outcomes
from .slots import Slots
from .state import WorkerState

#: The most rows one claim of batches takes (several batches of one queue).
MAX_CLAIM_ROWS = 1000


class Batches:
    """The batch tasks of one worker (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        registry: TaskRegistry,
        worker_id: str,
        state: WorkerState,
        slots: Slots,
        executor: Executor,
        completer: Completer,
        claim_events: ClaimEvents,
        free_slot: Callable[[str], None],
        release: Release,
        lease_seconds: Callable[[], float],
        polling: PollingConfig,
        asynchronous_commit: bool = True,
    ) -> None:
        self.store = store
        self.batch_store = BatchStore(store.pool, store.qualify)
        self.registry = registry
        self.worker_id = worker_id
        self.state = state
        self.slots = slots
        self.executor = executor
        self.completer = completer
        self.claim_events = claim_events
        self._free_slot = free_slot
        self._release = release
        self.lease_seconds = lease_seconds
        self.polling = polling
        # Its ``settled`` is unused: each batch settles its jobs itself.
        self.outcomes = Outcomes(
            store, worker_id, executor.retry_policy, self._wake_after, lambda _: None
        )
        # The loop's own connection (probes and claims), as the claim loop's.
        self.connection = HeldConnection(store.pool, asynchronous_commit=asynchronous_commit)
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._dirty = True
        # function -> (its names, its options); names of batch tasks.
        self._tasks: dict[Any, tuple[list[str], BatchOptions]] = {}
        self._names: frozenset[str] = frozenset()
        # batch slot key -> job ids of that batch not settled yet.
        self._open: dict[str, set[str]] = {}
        self._batch_of: dict[str, str] = {}
        registry.add_listener(self._registered)

    # -- which tasks ---------------------------------------------------------

    def _registered(self, _name: str) -> None:
        self._dirty = True
        self.wake()

    def _refresh(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        tasks: dict[Any, tuple[list[str], BatchOptions]] = {}
        for name in self.registry.names():
            func = self.registry.resolve(name)
            options = batch_options_of(func)
            if options is not None:
                tasks.setdefault(func, ([], options))[0].append(name)
        self._tasks = tasks
        self._names = frozenset(n for names, _ in tasks.values() for n in names)

    def plain(self, names: list[str]) -> list[str]:
        """``names`` without batch tasks: what the plain claim reads."""
        self._refresh()
        if not self._names:
            return names
        return [n for n in names if n not in self._names]

    def is_batch(self, task_name: str) -> bool:
        self._refresh()
        return task_name in self._names

    # -- the loop ------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def _wake_after(self, delay: float) -> None:
        # A retried job is due later: look again then.
        loop = asyncio.get_running_loop()
        if self._timer is not None and self._timer.when() <= loop.time() + delay:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(delay, self.wake)

    def start(self) -> None:
        """Run the loop (from the worker's start); it idles until a batch task is registered."""
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        task, self._loop_task = self._loop_task, None
        if self._timer is not None:
            self._timer.cancel()
        if task is not None and not task.done():
            self._wake.set()
            task.cancel()
            await asyncio.wait([task])
        await self.connection.release()

    async def _run(self) -> None:
        errors = Backoff(initial=0.1, maximum=5.0)
        while self.state.claiming:
            self._wake.clear()
            self._refresh()
            if not self._tasks:
                await self._sleep(self.polling.max_interval)
                continue
            try:
                wait = await self._round()
            except Exception as exc:
                level = log.warning if is_connection_error(exc) else log.exception
                level("batch claim failed", worker_id=self.worker_id, error=repr(exc))
                await self._sleep(errors.next_delay())
                continue
            errors.reset()
            if wait > 0:
                await self._sleep(wait)

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass

    async def _round(self) -> float:
        """Start every batch that is ready; seconds until one may be."""
        wait = self.polling.max_interval
        queues, _ = self.slots.claim_queues()
        for func, (names, options) in list(self._tasks.items()):
            # Several full batches of one queue are claimed by one statement.
            most = options.size * self._batches_at_once(options)
            found_all = await self.connection.run(
                partial(self.batch_store.queues, names, most, queues)
            )
            for found in found_all:
                if not self.state.claiming:
                    return wait
                ready_in = self._ready_in(found, options)
                if ready_in > 0:
                    wait = min(wait, ready_in)
                    continue
                full = found.due // options.size
                if await self._start(func, names, options, found.queue, max(1, full)):
                    wait = 0.0  # more may be ready: look again at once
                else:
                    wait = min(wait, self.polling.min_interval)
        return wait

    def _batches_at_once(self, options: BatchOptions) -> int:
        """How many batches of ``options.size`` one claim may take: the free
        slots, at most MAX_CLAIM_ROWS rows, at least one."""
        return max(1, min(self.slots.start_now(), MAX_CLAIM_ROWS // options.size))

    @staticmethod
    def _ready_in(found: BatchQueue, options: BatchOptions) -> float:
        if found.due >= options.size:
            return 0.0
        if found.due > 0:
            return max(0.0, options.timeout + found.head_in)
        # Nothing due yet: look when the earliest is (a full batch may be due then).
        return max(0.001, found.head_in)

    async def _permits(self, wanted: int, queue: str) -> int:
        """Take up to ``wanted`` slots (waiting, in turn with the plain jobs, for
        the first only); how many were taken (0: the queue has no room)."""
        slots = self.slots
        if slots.queue_limits is not None:
            wanted = min(wanted, slots.queue_free().get(queue, 0))
        if wanted <= 0:
            return 0
        await slots.semaphore.acquire()
        taken = 1
        while taken < wanted and slots.semaphore.take():
            taken += 1
        return taken

    async def _start(
        self, func: Any, names: list[str], options: BatchOptions, queue: str, batches: int
    ) -> bool:
        """Claim up to ``batches`` batches of ``queue`` in one statement and start
        each with a slot of its own; False: none claimed."""
        permits = await self._permits(batches, queue)
        if not permits:
            return False
        state = self.state
        state.claims_in_flight += 1
        state.claims_sent += 1
        rows: list[Any] = []
        run: list[Any] = []
        try:
            rows = await self.connection.run(
                partial(
                    self.store.claim,
                    self.worker_id,
                    names,
                    options.size * permits,
                    self.lease_seconds(),
                    start_now=options.size * permits,
                    queues=[queue],
                )
            )
            run = [r for r in rows if r["status"] == "running"]
            state.owned.update(r["job_id"] for r in run)
            if rows:
                try:
                    await self.connection.run(partial(self.claim_events.send, rows=rows))
                except Exception as exc:
                    log.warning("could not send the claim's events", error=repr(exc))
        except BaseException:
            # Cancelled (shutdown) with rows claimed: not owned, so the
            # heartbeat (or the shutdown's last step) hands them back.
            state.owned.difference_update(r["job_id"] for r in run)
            for _ in range(permits):
                self.slots.semaphore.release()
            raise
        finally:
            state.claims_in_flight -= 1
        self._log_expired(rows)
        # In the claim's order (priority, then due time), a slot per batch.
        run.sort(key=lambda r: (r["priority"], r["execution_time"]))
        chunks = [run[i : i + options.size] for i in range(0, len(run), options.size)]
        for _ in range(permits - len(chunks)):
            self.slots.semaphore.release()
        if not chunks:
            self.slots.changed.set()
            return bool(rows)
        self.executor.check_log_levels()
        self.outcomes.log_info = self.executor.log_info
        for chunk in chunks:
            self._launch(func, queue, chunk)
        return True

    def _log_expired(self, rows: list[Any]) -> None:
        for row in rows:
            if row["status"] == "expired":
                log.warning(
                    "job expired",
                    job_id=row["job_id"],
                    task=row["task_name"],
                    worker_id=self.worker_id,
                    attempt=row["attempts"],
                    event_type="expired",
                )

    def _launch(self, func: Any, queue: str, rows: list[Any]) -> None:
        """Start one batch on a slot already taken (its permit)."""
        slots, state = self.slots, self.state
        key = f"batch:{uuid.uuid4().hex}"
        slots.active += 1
        slots.taken[key] = True
        slots.held += 1
        slots.hold_queue(key, queue)
        self._open[key] = pending = {r["job_id"] for r in rows}
        for job_id in pending:
            self._batch_of[job_id] = key
        batch = BatchRun(
            batch_id=str(uuid.uuid4()),
            mark=partial(self.batch_store.mark, worker_id=self.worker_id),
            func=func,
            kind=getattr(func, EXECUTOR_ATTR, None),
            rows=rows,
            running=self.executor.running,
            outcomes=self.outcomes,
            queue_completion=self.completer.queue,
            run_thread=self.executor.sync.run_thread,
            release=self._release,
            job_timeout=self.executor.job_timeout,
            free_slot=partial(self._free_slot, key),
            settled=partial(self._settled, key),
        )
        context = None if state.job_context is None else state.job_context.copy()
        task = asyncio.create_task(batch.run(), context=context)
        state.tasks.add(task)
        task.add_done_callback(partial(self._batch_done, key))

    def _batch_done(self, key: str, task: asyncio.Task[Any]) -> None:
        # Exactly once per batch, even for a task cancelled before its first step.
        self.state.tasks.discard(task)
        self._free_slot(key)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("batch task crashed", error=repr(exc))
        if task.cancelled() or task.exception() is not None:
            # Nothing more will be written for its jobs: no longer owned, the
            # heartbeat hands them back (or their leases expire: the rescuer).
            self._close(key)

    def _settled(self, key: str, job_id: str) -> None:
        """A job of batch ``key`` has its outcome written (or given up on): let
        go of its row, and of the batch's slot row once it was the last."""
        self._let_go_job(key, job_id)
        pending = self._open.get(key)
        if pending is not None:
            pending.discard(job_id)
            if not pending:
                self._close(key)

    def _let_go_job(self, key: str, job_id: str) -> None:
        # Unless a later batch here holds the job again (its lease was lost
        # and it was claimed anew meanwhile).
        if self._batch_of.get(job_id) == key:
            del self._batch_of[job_id]
            self.state.owned.discard(job_id)

    def _close(self, key: str) -> None:
        """The batch's slot and held row are given back (idempotent)."""
        self._free_slot(key)
        pending = self._open.pop(key, None)
        if pending is not None:
            for job_id in pending:
                self._let_go_job(key, job_id)
            self.slots.let_go(job_ids=(key,))
