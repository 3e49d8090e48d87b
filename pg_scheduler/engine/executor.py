"""The executor: run one claimed job and settle what happened to it.

It decodes the arguments, runs the function (with its timeout), and records
the result (:class:`~.outcome.Outcomes`): completed through the completer, a
failure as a retry or failed, a cancel or shutdown as stopped or handed back.
It reports back to the claimer through narrow callbacks only (``free_slot``:
the function returned, let the next job run; ``settled``: a completion queued
by a job whose task has ended is written, let go of its row; ``release``: hand
rows back; ``wake_after``: look again when a retry is due); it never reads the
claimer's state.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback as tb
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, cast

import pg_scheduler.observe.instrument as instrument

from ..config import RetryPolicy
from ..context import enter_job, leave_job
from ..store import Completion, Store
from ..support.codec import UnstorableResult, decode_task_data, encode_result
from ..support.log import get_logger
from ..support.reconnect import retry_on_disconnect
from ..tasks import EXECUTOR_ATTR, TaskRegistry
from ..workflows.decorator import WORKFLOW
from ..workflows.errors import FINAL_ATTR, Interrupted, LeaseLost, Parked
from ..workflows.run import WRITE_PATIENCE
from ..workflows.runner import run_workflow
from .job import ClaimedJob, RunningJob
from .outcome import Outcomes
from .rate_starts import RateStarts, Stamped
from .sync import NotStarted, SyncRunners, default_process_pool_size

__all__ = [
    "BLOCKED_LOOP",
    "CANCELLED_REMOTELY",
    "LEASE_LOST",
    "SHUTDOWN",
    "ClaimedJob",
    "Executor",
    "RunningJob",
    "log",
]

# The engine's log lines keep the name they had when it was one module.
log = get_logger("pg_scheduler.worker")


def _enabled(level: int) -> bool:
    # Per-job log calls cost even when filtered (the keyword dict is built):
    # skip them when the application's structlog level drops them anyway.
    check = getattr(log, "is_enabled_for", None)
    return True if check is None else bool(check(level))


def _debug_enabled() -> bool:
    return _enabled(logging.DEBUG)


def _info_enabled() -> bool:
    return _enabled(logging.INFO)


# Why a running job's task was cancelled by us (as opposed to by the job itself).
CANCELLED_REMOTELY = "cancelled"  # cancel_job(): the row is already 'cancelled'
LEASE_LOST = "lease lost"  # the database no longer has it running here
SHUTDOWN = "shutdown"  # graceful shutdown ran out of grace: hand it back
BLOCKED_LOOP = "blocked the event loop"  # the watchdog failed it (services/stall.py)


class _SyncTimeout(Exception):
    """A sync job ran past its timeout (its process was killed, or its thread told to stop)."""


class Executor:
    """Runs claimed jobs of one worker; each call of :meth:`execute_job` is one job."""

    def __init__(
        self,
        *,
        store: Store,
        registry: TaskRegistry,
        worker_id: str,
        job_timeout: float | None,
        retry_policy: RetryPolicy,
        complete: Callable[[Completion], Awaitable[bool | str]],
        queue: Callable[[Completion, Callable[[RunningJob, Any], None], RunningJob], None],
        free_slot: Callable[[str], None],
        settled: Callable[[str], None],
        release: Callable[[list[str]], Awaitable[list[str]]],
        wake_after: Callable[[float], None],
        thread_pool_size: int = 10,
        process_pool_size: int | None = None,
        max_rescues: int = 3,
    ) -> None:
        self.store = store
        self.max_rescues = max_rescues
        self.registry = registry
        self.worker_id = worker_id
        self.job_timeout = job_timeout
        self.retry_policy = retry_policy
        self._complete = complete
        self._queue = queue
        self._free_slot = free_slot
        self._release = release
        self.outcomes = Outcomes(store, worker_id, retry_policy, wake_after, settled)
        self._settle = self.outcomes.settle
        self._fields = self.outcomes.fields
        self._failed = self.outcomes.failed
        self.retry_delay = self.outcomes.retry_delay
        #: Jobs whose function runs now, by id (the heartbeat and cancel look here).
        self.running: dict[str, RunningJob] = {}
        #: Thread jobs whose outcome is written but whose thread still runs, by id.
        self.lingering: dict[str, Any] = {}
        self.sync = SyncRunners(thread_pool_size, process_pool_size or default_process_pool_size())
        self.log_debug = self.log_info = True
        #: Rate-limited jobs claimed and not started yet (the keyed and the
        #: limited claims fill it): each function starts within the window's margin of its stamp.
        self.rate_starts = RateStarts(store, worker_id)

    def check_log_levels(self) -> None:
        # Checked once per claim, not per job.
        self.log_debug = _debug_enabled()
        self.log_info = self.outcomes.log_info = _info_enabled()

    async def execute_job(self, job_row: Mapping[str, Any], defer: bool = False) -> bool:
        """Run a claimed job, then complete it (or write its failure) under the lease guard.

        ``defer``: once the function has returned and its completion is queued,
        return True without waiting for the write; the completer settles it
        afterwards (``Outcomes.settle``: the log line, the observers, and the
        ``settled`` callback, which lets go of the row). Otherwise (and on
        every other path) the outcome is recorded before this returns False.
        """
        job = ClaimedJob.from_row(job_row)
        func = self.registry.resolve(job.task_name)
        if func is None:
            # We claim only registered names, so this is a race with a
            # registry change; hand it back rather than fail it.
            log.warning(
                "no function registered for claimed job, releasing it",
                job_id=job.job_id,
                task=job.task_name,
            )
            await self._release([job.job_id])
            return False
        # A rate-limited keyed job: its function must start within the rate
        # window's margin of its stamp (engine/rate_starts.py). A thread or
        # process job is checked where its function starts (_run_sync).
        rated = self.rate_starts.take(job.job_id) if self.rate_starts.stamped else None
        if rated is not None and getattr(func, EXECUTOR_ATTR, None) in (None, WORKFLOW):
            if not await self._admit(job, rated):
                return False
            rated = None
        current = asyncio.current_task()
        assert current is not None
        running = RunningJob(job, current, time.monotonic())
        self.running[job.job_id] = running
        token = enter_job(self.store, running, job_row)  # current_job()
        # Metrics and tracing observers; none installed: one attribute read.
        observed = instrument.started(job_row, job.task_name) if instrument.observers else None
        outcome = "interrupted"
        duration: float | None = None
        started = time.perf_counter()
        timeout = job.timeout if job.timeout is not None else self.job_timeout
        if self.log_debug:
            log.debug("job started", event_type="started", **self._fields(job))
        try:
            timer = None
            # Set at registration, so an async job pays one attribute read.
            kind = getattr(func, EXECUTOR_ATTR, None)
            try:
                args, kwargs = decode_task_data(job.task_data)
                if kind is not None:
                    if kind == WORKFLOW:
                        result = await run_workflow(
                            func,
                            store=self.store,
                            registry=self.registry,
                            worker_id=self.worker_id,
                            job_id=job.job_id,
                            attempt=job.attempt,
                            task=job.task_name,
                            row=job_row,
                            args=args,
                            kwargs=kwargs,
                            job_timeout=self.job_timeout,
                        )
                    else:
                        result = await self._run_sync(
                            kind, running, func, args, kwargs, timeout, job, rated
                        )
                elif timeout is None:
                    result = await func(*args, **kwargs)
                else:
                    async with asyncio.timeout(timeout) as timer:
                        result = await func(*args, **kwargs)
            except asyncio.CancelledError:
                reason = running.cancel_reason
                if reason is None and current.cancelling():
                    raise  # the worker itself is being torn down
                if reason is None:
                    # Raised by the job's own code (it awaited something that was
                    # cancelled): a failed attempt like any other exception. Left
                    # to propagate, the row would stay running here, be handed
                    # back and run again, forever.
                    self.running.pop(job.job_id, None)
                    self._slot_done(running)
                    message = "CancelledError: raised inside the job (not a cancel_job())"
                    duration = time.perf_counter() - started
                    outcome = await self._failed(job, message, tb.format_exc(), duration)
                    return False
                current.uncancel()
                self.running.pop(job.job_id, None)
                duration = time.perf_counter() - started
                if reason == SHUTDOWN:
                    outcome = "handed_back"
                    await self._release([job.job_id])
                    log.info(
                        "job handed back at shutdown",
                        event_type="released",
                        duration=duration,
                        **self._fields(job),
                    )
                else:
                    outcome = "cancelled" if reason == CANCELLED_REMOTELY else "lost"
                    log.info(
                        "job stopped",
                        event_type="cancelled",
                        reason=reason,
                        duration=duration,
                        **self._fields(job),
                    )
                return False
            except NotStarted as exc:
                # A rate-limited sync job whose start came too late, its window full.
                self.running.pop(job.job_id, None)
                self._slot_done(running)
                outcome = "handed_back"
                await self._not_admitted(job, cast("bool | None", exc.verdict))
                return False
            except Exception as exc:
                self.running.pop(job.job_id, None)
                self._slot_done(running)
                duration = time.perf_counter() - started
                if isinstance(exc, _SyncTimeout) or (timer is not None and timer.expired()):
                    message = f"timed out after {timeout:g} s"
                else:
                    message = f"{type(exc).__name__}: {exc}"
                # A workflow's code disagreeing with its record (and the like):
                # the same run would fail the same way, so no retry.
                final = getattr(exc, FINAL_ATTR, False) is True
                outcome = await self._failed(job, message, tb.format_exc(), duration, final)
                return False
            except (Parked, LeaseLost) as exc:
                # A workflow parked (its row is waiting, or pending again) or
                # found its job no longer its own: nothing more to write.
                self.running.pop(job.job_id, None)
                self._slot_done(running)
                duration = time.perf_counter() - started
                outcome = "parked" if isinstance(exc, Parked) else "lost"
                if outcome == "lost":
                    log.warning(
                        "workflow stopped: its job is no longer this run's; nothing written",
                        event_type="lease_lost",
                        duration=duration,
                        **self._fields(job),
                    )
                elif self.log_debug:
                    log.debug("workflow parked", event_type="parked", **self._fields(job))
                return False
            except Interrupted as exc:
                # A workflow's own statement lost the database (workflows/errors.py).
                self.running.pop(job.job_id, None)
                self._slot_done(running)
                duration = time.perf_counter() - started
                outcome = "handed_back"
                await self._interrupted(job, exc, duration)
                return False
            except BaseException as exc:
                # SystemExit, KeyboardInterrupt, GeneratorExit raised by the job's
                # code: a failed attempt like any exception. Left to propagate,
                # asyncio would stop the loop under the worker (no heartbeat, its
                # jobs stuck running). A real signal reaches the process through
                # its own handlers, never from inside a job.
                self.running.pop(job.job_id, None)
                self._slot_done(running)
                duration = time.perf_counter() - started
                message = (
                    f"{type(exc).__name__}: {exc} (raised by the job; the worker keeps running)"
                )
                outcome = await self._failed(job, message, tb.format_exc(), duration)
                return False
            self.running.pop(job.job_id, None)
            if running.linger is None:  # as _slot_done, inline on the hot path
                self._free_slot(job.job_id)
            duration = time.perf_counter() - started
            try:
                encoded, note = encode_result(result)
            except UnstorableResult as exc:
                # Not a retry: the same function would return the same result.
                outcome = await self._failed(job, str(exc), None, duration, final=True)
                return False
            if note:
                log.warning(note, **self._fields(job))
            completion = Completion(job.job_id, job.attempt, encoded, job.has_dependents)
            if defer and running.linger is None:
                # The task ends here: the completer settles the job after its write.
                if observed:
                    instrument.returned(observed)
                running.observed, observed = observed, None
                running.duration = duration
                self._queue(completion, self._settle, running)
                return True
            written: Any
            try:
                written = await self._complete(completion)
            except Exception as exc:
                written = exc
            outcome = self.outcomes.completed(job, written, duration)
            return False
        finally:
            try:
                if observed:
                    instrument.finished(observed, outcome, duration)
                if running.linger is not None:
                    await self._wait_linger(running)
            finally:
                leave_job(token)

    async def _interrupted(self, job: ClaimedJob, error: Interrupted, duration: float) -> None:
        """Hand back a workflow run that lost its connection: rescued as from a
        dead worker (counted against max_rescues), once the database answers
        again. Not written within the patience of a run's writes, the row is
        left to this worker's heartbeat or another worker's rescuer."""
        try:
            row = await retry_on_disconnect(
                lambda: self.store.rescue_interrupted(
                    job.job_id, self.worker_id, job.attempt, self.max_rescues
                ),
                what="workflow hand-back",
                give_up_after=WRITE_PATIENCE,
            )
        except Exception as exc:
            log.warning(
                "workflow interrupted; its hand-back was not written (a rescue will take it)",
                event_type="interrupted",
                error=repr(exc),
                duration=duration,
                **self._fields(job),
            )
            return
        log.warning(
            "workflow interrupted: the database connection was lost under the run",
            event_type="interrupted",
            error=str(error),
            now=None if row is None else row["status"],
            duration=duration,
            **self._fields(job),
        )

    async def _admit(self, job: ClaimedJob, rated: Stamped) -> bool:
        """Whether a rate-limited keyed job may start its function now (see
        :mod:`.rate_starts`); if not, it is handed back or no longer ours."""
        try:
            admitted = await self.rate_starts.admit(rated, job.job_id, job.attempt)
        except Exception as exc:  # no stamp can be moved: do not start late
            log.warning(
                "could not stamp a late rate-limited start again, handing the job back",
                error=repr(exc),
                **self._fields(job),
            )
            admitted = False
        if admitted:
            return True
        await self._not_admitted(job, admitted)
        return False

    async def _not_admitted(self, job: ClaimedJob, admitted: bool | None) -> None:
        if admitted is None:
            log.warning(
                "rate-limited job no longer this worker's before it started; not run",
                event_type="lease_lost",
                **self._fields(job),
            )
        else:
            await self._release([job.job_id])
            if self.log_debug:
                log.debug(
                    "rate-limited job handed back: it would start late and its window is full",
                    event_type="released",
                    **self._fields(job),
                )

    def _slot_done(self, running: RunningJob) -> None:
        # A thread still running keeps its slot: the job's task waits for it
        # (see _wait_linger) and the claimer frees the slot when the task ends.
        if running.linger is None:
            self._free_slot(running.job.job_id)

    async def _run_sync(
        self,
        kind: str,
        running: RunningJob,
        func: Callable[..., Any],
        args: Any,
        kwargs: Any,
        timeout: float | None,
        job: ClaimedJob,
        rated: Stamped | None,
    ) -> Any:
        running.on_loop = False
        gate = None
        if rated is not None:
            gate = partial(
                self.rate_starts.admit_in_thread,
                rated,
                job.job_id,
                job.attempt,
                asyncio.get_running_loop(),
            )
        job_id = running.job.job_id
        previous = self.lingering.get(job_id)
        if previous is not None:
            # A retry (or an operator's re-run) of a thread job whose earlier
            # attempt's thread still runs here: never two threads of one job.
            log.info("waiting for the previous attempt's thread to return", job_id=job_id)
            await asyncio.wait([asyncio.wrap_future(previous)])
        run = self.sync.run_thread if kind == "thread" else self.sync.run_process
        try:
            if timeout is None:
                return await run(running, func, args, kwargs, gate)
            async with asyncio.timeout(timeout) as timer:
                return await run(running, func, args, kwargs, gate)
        except TimeoutError:
            if timer.expired():
                raise _SyncTimeout(f"timed out after {timeout:g} s") from None
            raise
        finally:
            if running.linger is not None:
                # Before the outcome is written, so a retry claimed here sees it.
                self.lingering[job_id] = running.linger

    async def _wait_linger(self, running: RunningJob) -> None:
        # The outcome is written; hold the job's task (so its slot) until the
        # thread really returns. A second cancel (shutdown) stops waiting.
        try:
            await asyncio.wrap_future(running.linger)
        except asyncio.CancelledError:
            raise
        except BaseException:
            pass  # the job's outcome is already recorded
        finally:
            linger = running.linger
            if linger.done() and self.lingering.get(running.job.job_id) is linger:
                del self.lingering[running.job.job_id]
        log.info("cancelled thread job returned; slot freed", job_id=running.job.job_id)
