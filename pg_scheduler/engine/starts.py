"""Each started job's task: starting a claimed row when a slot is free (or
keeping it in the claimed-ahead buffer), its slot and permit, and letting go
of the row once its outcome is written. A part of :class:`~.claimer.Worker`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from .executor import Executor, log
from .slots import Slots
from .state import WorkerState


class Starts:
    """The worker's job tasks (see the module docstring)."""

    def __init__(
        self,
        *,
        state: WorkerState,
        slots: Slots,
        executor: Executor,
        worker_id: str,
        queue_paused: Callable[[str, bool], None],
    ) -> None:
        self.state = state
        self.slots = slots
        self.executor = executor
        self.worker_id = worker_id
        self._execute = executor.execute_job
        self._queue_paused = queue_paused

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
        self.state.owned.add(row["job_id"])
        # After stop_claiming nothing new starts: drain() hands the buffer back.
        slots = self.slots
        if slots.active < slots.max_running and self.state.claiming:
            self._start(row)
        else:
            slots.buffer_row(row)

    def _start(self, row: Mapping[str, Any]) -> None:
        job_id = row["job_id"]
        slots = self.slots
        state = self.state
        slots.active += 1
        if row.get("claimed_ahead"):
            state.started_ahead.append(job_id)
        # A slot is free here (see accept and free_slot), so the permit is
        # taken at once unless callers of execute_job_with_concurrency_control
        # hold some; then the task waits for one first (_run_claimed).
        if slots.semaphore.take():
            slots.taken[job_id] = True
            # True once the completion is queued: the completer settles it.
            coro = self._execute(row, True)
        else:
            slots.taken[job_id] = False
            coro = self._run_claimed(row)
        # Every job runs in a copy of the context start() ran in, whether a
        # claim or schedule() in a request handler started it: the caller's
        # context variables (its user, tenant, log bindings) stay with it.
        context = None if state.job_context is None else state.job_context.copy()
        task = asyncio.create_task(coro, context=context)
        state.tasks.add(task)
        task.add_done_callback(partial(self._job_task_done, job_id))

    def _job_task_done(self, job_id: str, task: asyncio.Task[Any]) -> None:
        # Runs exactly once per started job, even for a task cancelled before
        # its first step (whose finally blocks never run).
        self.state.tasks.discard(task)
        if job_id in self.slots.taken:  # not freed when its function returned
            self.free_slot(job_id)
        if task.cancelled():
            deferred = False
        elif (exc := task.exception()) is not None:
            log.error("job task crashed", error=repr(exc))
            deferred = False
        else:
            deferred = task.result()
        if not deferred:
            self.settled(job_id)
        # Else its completion is queued: the row stays owned and held until
        # the completer has written it (then settled).

    def settled(self, job_id: str) -> None:
        """The job's outcome is written (or given up on): the row is no longer held here."""
        self.state.owned.discard(job_id)
        self.slots.let_go(job_ids=(job_id,))

    async def execute_job_with_concurrency_control(self, job_row: Mapping[str, Any]) -> None:
        """Run one claimed job under the concurrency semaphore.

        The slot is freed as soon as the function returns (see :meth:`free_slot`);
        the job stays owned until its completion (or failure) is written.
        """
        self.slots.held += 1
        try:
            async with self.slots.semaphore:
                await self._execute(job_row)
        finally:
            self.state.owned.discard(job_row["job_id"])
            self.slots.let_go()

    async def _run_claimed(self, job_row: Mapping[str, Any]) -> bool:
        # A job started while execute_job_with_concurrency_control callers held
        # permits: wait for one. The accounting is free_slot's and
        # _job_task_done's alone.
        job_id = job_row["job_id"]
        slots = self.slots
        await slots.semaphore.acquire()
        if job_id in slots.taken:
            slots.taken[job_id] = True
        else:  # freed meanwhile (cannot happen today): keep the semaphore balanced
            slots.semaphore.release()
            return False
        return await self._execute(job_row, True)

    def free_slot(self, job_id: str) -> None:
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
        if slots.buffer and self.state.claiming:
            row = slots.buffer.popleft()[1]
            paused = self.state.paused_queues
            if paused and row.get("queue") in paused:
                slots.buffer.appendleft((time.monotonic(), row))
                self._queue_paused(row["queue"], True)
            else:
                self._start(row)
