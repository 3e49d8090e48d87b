"""Giving claimed rows back: the stale claimed-ahead buffer, queues paused while
rows of theirs were claimed ahead, cancellations, the shutdown drain, and at
the end of a shutdown every row held here that this process does not run. A
part of :class:`~.claimer.Worker`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from ..store import Store
from ..support.reconnect import retry_on_disconnect
from .completer import Completer
from .executor import SHUTDOWN, RunningJob, log
from .slots import Slots
from .state import WorkerState


class HandBack:
    """The worker's hand-backs (see the module docstring)."""

    def __init__(
        self,
        *,
        state: WorkerState,
        slots: Slots,
        store: Store,
        worker_id: str,
        running: Mapping[str, RunningJob],
        completer: Completer,
        release: Callable[[list[str]], Coroutine[Any, Any, list[str]]],
        wake: Callable[[], None],
    ) -> None:
        self.state = state
        self.slots = slots
        self.store = store
        self.worker_id = worker_id
        self.running = running  # the executor's: jobs whose function runs now
        self.completer = completer
        self._release = release
        self._wake = wake
        # Rows that wait longer than this for a slot are handed back (long jobs:
        # claiming ahead would only keep them from idle workers), and claiming
        # ahead pauses for a while.
        self.max_buffer_wait = 1.0
        self._force = asyncio.Event()

    def _in_background(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        background = self.state.tasks_background
        background.add(task)
        task.add_done_callback(background.discard)

    def queue_paused(self, queue: str, paused: bool) -> None:
        """An operator paused (or resumed) ``queue``: its claimed-ahead rows go back."""
        if paused:
            self.state.paused_queues[queue] = self.state.claims_sent
            self._in_background(self.hand_back_buffer(queue))
        else:
            self.state.paused_queues.pop(queue, None)
            self._wake()

    def drop_paused(self, rows: list[Any], claim: int) -> list[Any]:
        """Rows of queues paused while their claim was in flight go back at once."""
        paused = self.state.paused_queues
        for queue, heard in list(paused.items()):
            if claim > heard and any(r["queue"] == queue for r in rows):
                del paused[queue]  # claimed after the pause was heard: resumed since
        back = [r["job_id"] for r in rows if r["status"] == "running" and r["queue"] in paused]
        if not back:
            return rows
        self._in_background(self._release(back))
        return [r for r in rows if r["job_id"] not in set(back)]

    async def hand_back_stale(self) -> None:
        """Hand the buffer back once its oldest row waited past ``max_buffer_wait``."""
        oldest = self.slots.oldest_buffered()
        if oldest is not None and time.monotonic() - oldest > self.max_buffer_wait:
            self.slots.pause_prefetch(30.0)
            await self.hand_back_buffer()

    async def hand_back_buffer(self, queue: str | None = None) -> None:
        """Return every claimed-ahead row (of ``queue``) that has not started (one statement)."""
        buffer = self.slots.buffer
        if not buffer:
            return
        if queue is None:
            ids = [row["job_id"] for _, row in buffer]
            buffer.clear()
        else:
            ids = [row["job_id"] for _, row in buffer if row.get("queue") == queue]
            kept = [entry for entry in buffer if entry[1].get("queue") != queue]
            buffer.clear()
            buffer.extend(kept)
        if not ids:
            return
        try:
            await self._release(ids)
        finally:
            owned = self.state.owned
            for job_id in ids:
                owned.discard(job_id)
            self.slots.let_go(len(ids), ids)

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
                self.state.owned.discard(job_id)
                self.slots.let_go(job_ids=(job_id,))
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
        tasks = self.state.tasks
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_period
        while tasks and not self._force.is_set() and loop.time() < deadline:
            forced = asyncio.create_task(self._force.wait())
            await asyncio.wait(
                {*tasks, forced},
                timeout=deadline - loop.time(),
                return_when=asyncio.FIRST_COMPLETED,
            )
            forced.cancel()
        if tasks:
            running = {r.task for r in self.running.values()}
            for job_id in list(self.running):
                self.cancel_local(job_id, SHUTDOWN)
            _, stubborn = await asyncio.wait(set(tasks), timeout=10.0)
            # Tasks still writing an outcome the database does not take (a row
            # locked elsewhere): given up, their rows are rescued.
            for task in stubborn - running:
                task.cancel()
            if stubborn:
                log.error(
                    "jobs ignored cancellation; their leases will expire and they will be rescued",
                    jobs=len(stubborn),
                )
        await self.completer.drain()
        await self.completer.connection.release()
        self._force.clear()  # the request was for this shutdown, not one after a restart

    async def hand_back_unowned(self, timeout: float = 5.0) -> list[str]:
        """The last step of a shutdown, after :meth:`drain` (and after in-process
        starts in flight have answered): one statement hands back every row
        held ``running`` here except those this process still owns (jobs that
        ignored their cancellation, outcomes not written), as never started:
        the attempt is not counted. What it finds: rows of in-process starts
        whose caller was cancelled mid-insert, claims whose answer was lost,
        rows that reached the buffer after it was handed back. Returns their ids."""
        background = self.state.tasks_background
        if background:  # hand-backs already under way finish first
            await asyncio.wait(set(background), timeout=timeout)
        owned = self.state.owned
        buffer = self.slots.buffer
        buffered = [row["job_id"] for _, row in buffer]
        if buffered:
            buffer.clear()
            owned.difference_update(buffered)
            self.slots.let_go(len(buffered), buffered)
        keep = list(owned)
        try:
            released: list[str] = await retry_on_disconnect(
                lambda: self.store.release_unowned(self.worker_id, keep),
                what="hand back",
                give_up_after=timeout,
            )
        except Exception as exc:
            log.warning(
                "could not hand back rows held here but not started; they will be rescued",
                error=repr(exc),
            )
            return []
        if released:
            log.info(
                "handed back rows held here but never started",
                worker_id=self.worker_id,
                jobs=len(released),
            )
        return released
