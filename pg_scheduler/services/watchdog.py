"""The event-loop watchdog: a thread that notices when the loop stops running.

A job that blocks the loop (``time.sleep`` in an ``async def``) freezes every
other job and the heartbeat, silently. The loop stamps a time every
``threshold / 4`` seconds; the thread checks it and, when it is older than
``threshold``, logs one WARNING naming the job on the loop (the loop's current
task) and the frame where the loop thread is stuck, then, once the loop runs
again, how long the stall lasted. No thread at all when disabled.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from ..log import get_logger

log = get_logger("pg_scheduler.watchdog")


class LoopWatchdog:
    def __init__(self, threshold: float, running: Callable[[], Mapping[str, Any]]) -> None:
        self.threshold = threshold
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

    def _warn(self, seconds: float) -> None:
        frame = sys._current_frames().get(self._loop_thread)
        where = "".join(traceback.format_stack(frame, limit=3)) if frame else "unknown"
        blocker = None
        loop = self._loop
        # Read from another thread: a snapshot is all we need for a log line.
        current_tasks = getattr(asyncio.tasks, "_current_tasks", {})
        current = current_tasks.get(loop) if loop is not None else None
        on_loop = []
        for job_id, running in list(self._running().items()):
            if not running.on_loop:
                continue  # a thread or process job cannot block the loop
            label = f"{running.job.task_name} ({job_id})"
            on_loop.append(label)
            if running.task is current:
                blocker = label
        log.warning(
            "event loop blocked: a job is running blocking code on the loop",
            blocked_for=round(seconds, 3),
            blocking_job=blocker,
            running_jobs=on_loop,
            stuck_at=where,
        )
