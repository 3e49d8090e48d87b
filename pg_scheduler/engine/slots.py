"""Capacity: the one owner of how many jobs may run and how many rows are held.

``max_concurrent_jobs`` and ``batch_claim_limit`` become every limit here, and
nowhere else; everything the claimer, the executor's callbacks and the
in-process start decide about room is asked here. Two counts: ``active``
(jobs started: their function runs or is about to take a semaphore slot) and
``held`` (rows this worker holds ``running`` in the database: started,
buffered, or awaiting their completion write). A slot is given back when the
function returns, so the next job starts while the completion is written;
``held`` drops only after the write, so a worker never holds more than
``max_running + prefetch`` rows.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from typing import Any


class Slots:
    """Capacity of one worker (see the module docstring)."""

    def __init__(self, max_concurrent_jobs: int, batch_claim_limit: int) -> None:
        self.max_running = max_concurrent_jobs
        self.batch_claim_limit = batch_claim_limit
        self.semaphore = asyncio.Semaphore(max_concurrent_jobs)
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
        free = self.max_running + (0 if paused else self.prefetch) - self.held
        idle = self.active + len(self.buffer) < self.max_running
        if free <= 0 or (free < self.min_claim and not idle) or unwritten >= self.max_unwritten:
            return 0
        return min(free, self.batch_claim_limit)

    def start_now(self) -> int:
        """How many of a claim's rows start at once; the rest are claimed ahead."""
        return max(0, self.max_running - self.active - len(self.buffer))

    def pause_prefetch(self, seconds: float) -> None:
        self.prefetch_paused_until = time.monotonic() + seconds

    def reserve(self) -> bool:
        """Hold a row for a job this process is about to insert running here."""
        if self.held >= self.max_running:
            return False
        self.held += 1
        return True

    def let_go(self, rows: int = 1) -> None:
        """Rows no longer held here (settled, handed back or never written)."""
        self.held = max(0, self.held - rows)
        self.changed.set()
