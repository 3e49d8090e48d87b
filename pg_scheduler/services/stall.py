"""Keep a worker alive while its event loop is blocked, and blame the job that blocks it.

The heartbeat runs on the loop, so a job that blocks the loop (``time.sleep``
in an ``async def``) used to stop it: past the threshold the worker looked
dead, every job it held was rescued and re-run elsewhere (the blocker in
parallel with itself) and the innocent ones counted the rescue against their
``max_rescues``. The watchdog thread calls :meth:`StallGuard.tick` while the
loop is stalled; from that thread, on a connection of its own driven by a
private event loop (the pool's connections belong to the blocked loop), it:

- renews this worker's row and all its leases every ``heartbeat_interval``
  once the stall is longer than one interval (shorter stalls cost nothing);
- at ``limit`` seconds fails (or retries, per the job's policy) the job the
  watchdog names as the blocker, under the lease guard, and asks the loop to
  stop that job's task when it runs again (its late result is refused by the
  same guard);
- past ``2 * limit`` stops renewing: a loop stuck that long is a hung
  process, and the usual rescue takes its jobs.

The connection is opened on the first renewal of a stall and closed when the
stall ends, so a worker holds no extra connection outside stalls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from ..store import Store
from ..support.codec import ERROR_MAX_CHARS, TRACEBACK_MAX_CHARS, clip_text
from ..support.log import get_logger

log = get_logger("pg_scheduler.watchdog")


def default_stall_limit(lease_duration: float, heartbeat_threshold: float) -> float:
    """At least a minute, and never shorter than the time after which such a
    worker was declared dead before the guard existed (no job that used to
    complete fails now)."""
    return max(60.0, min(lease_duration, heartbeat_threshold))


class StallGuard:
    """The watchdog's actions during a stall (everything here runs in its thread)."""

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        store: Store,
        worker_id: str,
        lease_seconds: Callable[[], float],
        interval: float,
        limit: float,
        retry_delay: Callable[[Any], float | None],
        stop_blocker: Callable[[str], Any],
    ) -> None:
        self.pool = pool
        self.store = store
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self.interval = interval
        self.limit = limit
        self._retry_delay = retry_delay  # ClaimedJob -> delay, or None
        self._stop_blocker = stop_blocker  # job id -> None, run on the worker's loop
        #: The worker's (blocked) loop; set by the watchdog when it starts.
        self.main_loop: asyncio.AbstractEventLoop | None = None
        self._timeout = max(2.0, interval)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: asyncpg.Connection | None = None
        self._renewed_at = 0.0
        self._blamed: set[str] = set()
        self._gave_up = False
        self._announced = False
        #: What tests and metrics read: renewals written, blockers failed.
        self.renewals = 0
        self.failed: list[str] = []

    def tick(self, stalled_for: float, blocker: Any, where: str) -> None:
        """One look during a stall of ``stalled_for`` s; ``blocker``: the RunningJob
        on the loop now (or None), ``where``: the loop thread's innermost frames."""
        if stalled_for < self.interval or self._gave_up:
            return
        if stalled_for >= 2 * self.limit:
            log.error(
                "event loop stuck past twice loop_stall_limit; no longer renewing this "
                "worker's leases (its jobs will be rescued)",
                stalled_for=round(stalled_for, 3),
                worker_id=self.worker_id,
            )
            self.end()
            self._gave_up = True  # until this stall ends
            return
        if stalled_for >= self.limit and blocker is not None:
            job_id = blocker.job.job_id
            if job_id not in self._blamed:
                self._blamed.add(job_id)
                self._run(self._fail(blocker, stalled_for, where))
        now = time.monotonic()
        if now - self._renewed_at >= self.interval:
            self._renewed_at = now
            self._run(self._renew())

    def end(self) -> None:
        """The stall is over (or the watchdog stops): drop the side connection."""
        self._renewed_at = 0.0
        self._blamed.clear()
        self._gave_up = False
        self._announced = False
        conn, self._conn = self._conn, None
        loop = self._loop
        if conn is not None and loop is not None:
            try:
                loop.run_until_complete(asyncio.wait_for(conn.close(), self._timeout))
            except Exception:
                conn.terminate()

    def close(self) -> None:
        self.end()
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()

    # -- on the private loop ------------------------------------------------

    def _run(self, step: Any) -> None:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(step)
        except Exception as exc:
            log.warning("watchdog could not write during a stall", error=repr(exc))
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.terminate()

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            # The pool's own connect function and arguments (DSN, ssl, statement
            # cache for pgbouncer): private attributes of asyncpg.Pool.
            pool: Any = self.pool
            connect = getattr(pool, "_connect", None) or asyncpg.connect
            self._conn = await asyncio.wait_for(
                connect(*pool._connect_args, **pool._connect_kwargs), self._timeout
            )
        return self._conn

    async def _renew(self) -> None:
        conn = await self._connection()
        held = await self.store.renew_while_stalled(
            conn, self.worker_id, self.lease_seconds(), self._timeout
        )
        self.renewals += 1
        if not self._announced:
            self._announced = True
            log.warning(
                "watchdog renewing this worker's leases while the event loop is blocked",
                jobs=len(held),
                worker_id=self.worker_id,
            )

    async def _fail(self, blocker: Any, stalled_for: float, where: str) -> None:
        job = blocker.job
        message = clip_text(
            f"blocked the event loop for {stalled_for:.1f} s (loop_stall_limit="
            f"{self.limit:g} s): run blocking code with @task(executor='thread') or await it",
            ERROR_MAX_CHARS,
        )
        delay = self._retry_delay(job)
        conn = await self._connection()
        written = await self.store.fail_blocker(
            conn,
            job.job_id,
            self.worker_id,
            job.attempt,
            message,
            clip_text("the loop thread was here:\n" + where, TRACEBACK_MAX_CHARS),
            delay,
            self._timeout,
        )
        if not written:
            return  # it finished (or was rescued) meanwhile: nothing to blame
        self.failed.append(job.job_id)
        log.error(
            "job failed: it blocked the event loop",
            event_type="retried" if delay is not None else "failed",
            job_id=job.job_id,
            task=job.task_name,
            worker_id=self.worker_id,
            attempt=job.attempt,
            blocked_for=round(stalled_for, 3),
            retry_in=None if delay is None else round(delay, 3),
        )
        if self.main_loop is not None:
            try:
                # Runs when the loop runs again: the task is cancelled at its next await.
                self.main_loop.call_soon_threadsafe(self._stop_blocker, job.job_id)
            except RuntimeError:
                pass  # the loop is closed: nothing left to stop
