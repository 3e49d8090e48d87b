"""Capacity: the one owner of how many jobs may run and how many rows are held.

``max_concurrent_jobs`` and ``batch_claim_limit`` become every limit here, and
nowhere else; everything the claimer, the executor's callbacks and the
in-process start decide about room is asked here. Two counts: ``active``
(jobs started: their function runs or is about to take a semaphore slot) and
``held`` (rows this worker holds ``running`` in the database: started,
buffered, or awaiting their completion write). A slot is given back when the
function returns, so the next job starts while the completion is written;
``held`` drops only after the write. Up to ``prefetch`` rows awaiting their
write do not count against the claim, so the next claim overlaps the write of
the last batch: a worker holds at most ``max_running + 2 x prefetch`` rows,
of which at most ``prefetch`` claimed and not started.

Queues: ``served`` is the queues this worker claims from (None: every queue);
``queue_limits`` (a mapping given to the Scheduler) caps the rows held per
queue, so a queue never runs more than its limit here and no claim asks a
queue for more than its free slots (no claiming ahead beyond it).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any


class Permits:
    """The ``max_concurrent_jobs`` semaphore (acquire, release, locked, ``async
    with``), whose uncontended take is synchronous: a claimed job starts
    without a coroutine for it. A release hands the permit to the first
    waiter, so none is taken out of turn."""

    def __init__(self, value: int) -> None:
        self._value = value
        self._waiters: deque[asyncio.Future[None]] = deque()

    def locked(self) -> bool:
        return self._value <= 0 or any(not w.done() for w in self._waiters)

    def take(self) -> bool:
        """Take a permit if one is free and nobody waits; never blocks."""
        if self._value > 0 and not self._waiters:
            self._value -= 1
            return True
        return False

    async def acquire(self) -> bool:
        if self.take():
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed to us just before the cancel: pass it on
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return True

    def release(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._value += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class Slots:
    """Capacity of one worker (see the module docstring)."""

    def __init__(
        self,
        max_concurrent_jobs: int,
        batch_claim_limit: int,
        served: Sequence[str] | None = None,
        queue_limits: Mapping[str, int] | None = None,
    ) -> None:
        self.max_running = max_concurrent_jobs
        self.served = None if served is None else list(served)
        self.queue_limits = dict(queue_limits) if queue_limits else None
        # Rows held per limited queue, and the queue of each such row held.
        self.queue_held: dict[str, int] = dict.fromkeys(self.queue_limits or (), 0)
        self.held_in: dict[str, str] = {}
        # Called when a full queue gets room (the claim loop may be asleep).
        self.on_queue_room: Callable[[], None] = lambda: None
        self.batch_claim_limit = batch_claim_limit
        self.semaphore = Permits(max_concurrent_jobs)
        # Claim ahead: up to one batch waits locally for a slot, so the next
        # claim overlaps the running jobs. While every slot is busy, claim only
        # once half a batch has room (no one-row claims).
        self.prefetch = min(batch_claim_limit, max_concurrent_jobs)
        self.min_claim = max(1, self.prefetch // 2)
        # Unwritten completions beyond this stop claiming (memory stays bounded).
        self.max_unwritten = max(1000, 4 * max_concurrent_jobs)
        self.prefetch_paused_until = 0.0
        self.active = 0
        self.held = 0
        # Started jobs -> whether they hold a semaphore slot yet.
        self.taken: dict[str, bool] = {}
        # Claimed-ahead rows waiting for a slot (no task yet), with the time they arrived.
        self.buffer: deque[tuple[float, Mapping[str, Any]]] = deque()
        # Set whenever room may have appeared; the claim loop waits on it.
        self.changed = asyncio.Event()

    def claim_limit(self, unwritten: int) -> int:
        """How many rows the next claim may ask for; 0: wait for room."""
        paused = time.monotonic() < self.prefetch_paused_until
        # One batch of rows awaiting their completion write takes no room.
        writing = min(unwritten, self.prefetch)
        free = self.max_running + (0 if paused else self.prefetch) - self.held + writing
        idle = self.active + len(self.buffer) < self.max_running
        if free <= 0 or (free < self.min_claim and not idle) or unwritten >= self.max_unwritten:
            return 0
        if self.queue_limits is not None:
            free = min(free, sum(self.queue_free().values()))
        return min(free, self.batch_claim_limit)

    def queue_free(self) -> dict[str, int]:
        """Limited queues with room: queue -> rows a claim may take from it."""
        assert self.queue_limits is not None
        held = self.queue_held
        return {q: n - held[q] for q, n in self.queue_limits.items() if n > held[q]}

    def claim_queues(self) -> tuple[list[str] | None, list[int] | None]:
        """The queues the next claim reads (None: all) and, with limits, each one's cap."""
        if self.queue_limits is None:
            return self.served, None
        free = self.queue_free()
        return list(free), list(free.values())

    def hold(self, row: Mapping[str, Any]) -> None:
        """A row claimed or inserted running here is held."""
        self.held += 1
        if self.queue_limits is not None:
            self.hold_queue(row["job_id"], row.get("queue"))

    def hold_queue(self, job_id: str, queue: str | None) -> None:
        if self.queue_limits is not None and queue in self.queue_held:
            self.queue_held[queue] += 1
            self.held_in[job_id] = queue

    def queue_has_room(self, queue: str) -> bool:
        """May a job of ``queue`` be held here now (served, and under its limit)?"""
        if self.queue_limits is not None:
            return queue in self.queue_limits and self.queue_held[queue] < self.queue_limits[queue]
        return self.served is None or queue in self.served

    def buffer_row(self, row: Mapping[str, Any]) -> None:
        """Keep a claimed row until a slot frees, behind every buffered row of
        the same or a more urgent priority: a CRITICAL job claimed during a
        drain overtakes the claimed-ahead NORMAL rows instead of waiting for them."""
        buffer = self.buffer
        priority = row.get("priority") or 0
        index = len(buffer)
        while index and (buffer[index - 1][1].get("priority") or 0) > priority:
            index -= 1
        buffer.insert(index, (time.monotonic(), row))

    def oldest_buffered(self) -> float | None:
        """When the longest-waiting buffered row arrived (the buffer is in
        start order, not arrival order)."""
        return min((arrived for arrived, _ in self.buffer), default=None)

    def start_now(self) -> int:
        """How many of a claim's rows start at once; the rest are claimed ahead."""
        return max(0, self.max_running - self.active - len(self.buffer))

    def pause_prefetch(self, seconds: float) -> None:
        self.prefetch_paused_until = time.monotonic() + seconds

    def reserve(self, job_id: str = "", queue: str | None = None) -> bool:
        """Hold a row for a job this process is about to insert running here."""
        if self.held >= self.max_running:
            return False
        if queue is not None and not self.queue_has_room(queue):
            return False
        self.held += 1
        self.hold_queue(job_id, queue)
        return True

    def let_go(self, rows: int = 1, job_ids: Iterable[str] = ()) -> None:
        """Rows no longer held here (settled, handed back or never written);
        ``job_ids``: which, for the per-queue counts."""
        self.held = max(0, self.held - rows)
        if self.held_in:
            limits = self.queue_limits or {}
            for job_id in job_ids:
                queue = self.held_in.pop(job_id, None)
                if queue is not None:
                    full = self.queue_held[queue] >= limits[queue]
                    self.queue_held[queue] -= 1
                    if full:
                        self.on_queue_room()
        self.changed.set()
