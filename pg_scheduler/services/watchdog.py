"""The event-loop watchdog: a thread that notices when the loop stops running.

A job that blocks the loop (``time.sleep`` in an ``async def``) freezes every
other job and the heartbeat, silently. The loop stamps a time every
``threshold / 4`` seconds; the thread checks it and, when it is older than
``threshold``, logs one WARNING naming the job on the loop (the loop's current
task) and the frame where the loop thread is stuck, then, once the loop runs
again, how long the stall lasted. No thread at all when disabled.

With a :class:`~pg_scheduler.services.stall.StallGuard` it also acts during
the stall (renew this worker's leases, fail the blocker past the limit): see
that module.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from ..support.log import get_logger
from .stall import StallGuard

log = get_logger("pg_scheduler.watchdog")


class LoopWatchdog:
    def __init__(
        self,
        threshold: float,
        running: Callable[[], Mapping[str, Any]],
        guard: StallGuard | None = None,
    ) -> None:
        self.threshold = threshold
        self.guard = guard
        self.interval = threshold / 4
        self._running = running  # job id -> RunningJob (the executor's dict)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._beat = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Stalls noticed since start (tests and metrics read it).
        self.stalls = 0

    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        if self.guard is not None:
            self.guard.main_loop = self._loop
        self._stop.clear()
        self._tick()
        self._thread = threading.Thread(
            target=self._watch, name="pg_scheduler-watchdog", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        await asyncio.to_thread(thread.join)
        if self.guard is not None:
            await asyncio.to_thread(self.guard.close)

    def _tick(self) -> None:
        # On the loop: if this stamp gets old, the loop is not running callbacks.
        self._beat = time.monotonic()
        assert self._loop is not None
        self._timer = self._loop.call_later(self.interval, self._tick)

    def _watch(self) -> None:
        stalled_since: float | None = None
        while not self._stop.wait(self.interval):
            beat = self._beat
            if stalled_since is None:
                if time.monotonic() - beat > self.threshold:
                    stalled_since = beat
                    self.stalls += 1
                    self._warn(time.monotonic() - beat)
            elif beat > stalled_since:
                # The loop stamped again: it ran at about ``beat``.
                log.warning(
                    "event loop stall ended",
                    stalled_for=round(beat - stalled_since - self.interval, 3),
                )
                stalled_since = None
                if self.guard is not None:
                    self.guard.end()
            if stalled_since is not None and self.guard is not None:
                blocker, _on_loop = self._blocker()
                self.guard.tick(time.monotonic() - stalled_since, blocker, self._where())
        if self.guard is not None:
            self.guard.end()

    def _where(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        return "".join(traceback.format_stack(frame, limit=3)) if frame else "unknown"

    def _blocker(self) -> tuple[Any, list[str]]:
        """The job whose task is on the loop now (or None), and every job on the loop."""
        loop = self._loop
        # Read from another thread: a snapshot is all we need.
        current_tasks = getattr(asyncio.tasks, "_current_tasks", {})
        current = current_tasks.get(loop) if loop is not None else None
        blocker = None
        on_loop = []
        for job_id, running in list(self._running().items()):
            if not running.on_loop:
                continue  # a thread or process job cannot block the loop
            on_loop.append(f"{running.job.task_name} ({job_id})")
            if running.task is current:
                blocker = running
        return blocker, on_loop

    def _warn(self, seconds: float) -> None:
        blocker, on_loop = self._blocker()
        log.warning(
            "event loop blocked: a job is running blocking code on the loop",
            blocked_for=round(seconds, 3),
            blocking_job=None
            if blocker is None
            else f"{blocker.job.task_name} ({blocker.job.job_id})",
            running_jobs=on_loop,
            stuck_at=self._where(),
        )
