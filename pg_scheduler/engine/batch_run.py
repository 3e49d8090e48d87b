"""Running one claimed batch: the handler called once with every job's item,
then each job's outcome recorded on its own row (docs/batches.md).

Every job of the batch is in the executor's ``running`` map while the handler
runs, under a :class:`_Member` handle in place of its task: the heartbeat
renews and reconciles it, ``cancel_job`` and a lost lease reach it, shutdown
hands it back, exactly as for a job of its own. Cancelling one member marks
its item ``cancelled`` and leaves the handler running for the others; once
every member is cancelled (or lost, or handed back), the handler is.

As the handler is called, one statement records the batch and the jobs it
is given (a row of ``scheduler_batches``: migration 0020), written beside the
handler and waited for before the outcomes; a mark that cannot be written is
logged and the batch runs all the same.

Outcomes: a result is a completion through the completer (one group commit
for the whole batch); an exception object in the results, or an exception
the handler raised, is a failed attempt of each job it concerns, written by
:meth:`Outcomes.failed <.outcome.Outcomes.failed>` with that job's own retry
policy. A handler that returns anything but one result per job fails each
job the same way (a bounded retry, never a loop).
"""

from __future__ import annotations

import asyncio
import time
import traceback as tb
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import pg_scheduler.observe.instrument as instrument

from ..batching import BatchItem
from ..store import Completion
from ..support.codec import UnstorableResult, decode_task_data, encode_result
from .executor import SHUTDOWN, log
from .job import ClaimedJob, RunningJob
from .outcome import Outcomes

#: How a batch hands rows back (at shutdown): the worker's release.
Release = Callable[[list[str]], Awaitable[list[str]]]
#: How a batch records itself as it starts: (batch id, task, queue, [(job
#: id, attempt)]) -> jobs it names (``BatchStore.mark`` for the worker).
Mark = Callable[[str, str, str, list[tuple[str, int]]], Awaitable[int]]
#: Seconds the mark may take (a busy pool, a connection being made) before
#: the batch runs without it.
MARK_TIMEOUT = 5.0


class _Member:
    """Stands in for a job's task in the executor's ``running`` map: a cancel
    (``cancel_job``, a lost lease, shutdown) marks the job's item, and cancels
    the handler only once no member is left to run for."""

    __slots__ = ("_batch", "_job_id")

    def __init__(self, batch: BatchRun, job_id: str) -> None:
        self._batch = batch
        self._job_id = job_id

    def cancel(self, msg: Any = None) -> bool:
        self._batch.member_cancelled(self._job_id)
        return True

    def done(self) -> bool:
        return False


class BatchRun:
    """One batch: its rows, claimed here and running; :meth:`run` is its task.
    It tells its worker ``free_slot()`` once the handler has returned, and
    ``settled(job_id)`` once a job's outcome is written (or given up on)."""

    def __init__(
        self,
        *,
        batch_id: str,
        mark: Mark,
        func: Callable[..., Any],
        kind: str | None,
        rows: list[Any],
        running: dict[str, RunningJob],
        outcomes: Outcomes,
        queue_completion: Callable[[Completion, Callable[[Any, Any], None], Any], None],
        run_thread: Callable[[Any, Any, Any, Any], Awaitable[Any]],
        release: Release,
        job_timeout: float | None,
        free_slot: Callable[[], None],
        settled: Callable[[str], None],
    ) -> None:
        self.batch_id = batch_id
        self._mark = mark
        self.func = func
        self.kind = kind
        self.rows = rows
        self.running = running
        self.outcomes = outcomes
        self._queue = queue_completion
        self._run_thread = run_thread
        self._release = release
        self.job_timeout = job_timeout
        self._free_slot = free_slot
        self._settled = settled
        self.items: dict[str, BatchItem] = {}
        self.members: dict[str, RunningJob] = {}
        self.jobs: dict[str, ClaimedJob] = {}
        self.observed: dict[str, Any] = {}
        self.cancel_reason: str | None = None
        self.handed_back: list[str] = []
        self.task: asyncio.Task[Any] | None = None
        self.duration: float | None = None

    # -- cancels -----------------------------------------------------------

    def member_cancelled(self, job_id: str) -> None:
        item = self.items.get(job_id)
        member = self.members.get(job_id)
        if item is None or member is None or item.cancelled:
            return
        item.cancelled = True
        if member.cancel_reason == SHUTDOWN:
            self.handed_back.append(job_id)
        if self.task is not None and all(i.cancelled for i in self.items.values()):
            self.cancel_reason = SHUTDOWN if self.handed_back else member.cancel_reason
            self.task.cancel()

    # -- the run -----------------------------------------------------------

    async def run(self) -> None:
        current = asyncio.current_task()
        assert current is not None
        self.task = current
        try:
            await self._prepare()
            if self.items:
                await self._call(current)
        finally:
            for job_id, member in self.members.items():
                if self.running.get(job_id) is member:  # not a later claim's
                    del self.running[job_id]
            self._free_slot()

    async def _prepare(self) -> None:
        now = time.monotonic()
        on_loop = self.kind is None
        for row in self.rows:
            job = ClaimedJob.from_row(row)
            try:
                args, kwargs = decode_task_data(job.task_data)
            except Exception as exc:
                # The same arguments would fail the same way: no retry.
                message = f"arguments not readable: {type(exc).__name__}: {exc}"
                await self._fail(job, message, None, 0.0, final=True)
                continue
            self.jobs[job.job_id] = job
            self.items[job.job_id] = BatchItem(job.job_id, args, kwargs, job.attempt, row["queue"])
            member = RunningJob(job, cast(Any, _Member(self, job.job_id)), now, on_loop=on_loop)
            self.running[job.job_id] = self.members[job.job_id] = member
            if instrument.observers:
                self.observed[job.job_id] = instrument.started(row, job.task_name)

    def _timeout(self) -> float | None:
        """The shortest timeout among the jobs (each one's own, else the worker's)."""
        timeouts = [
            job.timeout if job.timeout is not None else self.job_timeout
            for job in self.jobs.values()
        ]
        known = [t for t in timeouts if t is not None]
        return min(known) if known else None

    async def _call(self, current: asyncio.Task[Any]) -> None:
        items = list(self.items.values())
        timeout = self._timeout()
        started = time.perf_counter()
        timer = None
        holder = SimpleNamespace(stopped=False, linger=None, job=next(iter(self.jobs.values())))
        # Written beside the handler (it delays no batch); waited for before
        # the outcomes are, so a finished job's batch is always on record.
        marking = asyncio.ensure_future(self._mark_jobs(items))
        try:
            if self.kind == "thread":
                call = self._run_thread(holder, self.func, (items,), {})
                if timeout is None:
                    result = await call
                else:
                    async with asyncio.timeout(timeout) as timer:
                        result = await call
            elif timeout is None:
                result = await self.func(items)
            else:
                async with asyncio.timeout(timeout) as timer:
                    result = await self.func(items)
        except asyncio.CancelledError:
            reason = self.cancel_reason
            if reason is None and current.cancelling():
                marking.cancel()
                raise  # the worker itself is being torn down: its rows are rescued
            if reason is not None:
                current.uncancel()  # our own cancel, handled here
            self.duration = time.perf_counter() - started
            await marking
            await self._wait_thread(holder)
            if reason is None:
                message = "CancelledError: raised inside the batch handler (not a cancel_job())"
                await self._fail_all(message, tb.format_exc())
                return
            await self._stopped(reason)
            return
        except BaseException as exc:
            self.duration = time.perf_counter() - started
            await marking
            await self._wait_thread(holder)
            if timer is not None and timer.expired():
                message = f"timed out after {timeout:g} s"
            else:
                message = f"{type(exc).__name__}: {exc}"
                if not isinstance(exc, Exception):
                    message += " (raised by the batch handler; the worker keeps running)"
            await self._fail_all(f"{message} [the batch of {len(items)} failed]", tb.format_exc())
            return
        self.duration = time.perf_counter() - started
        self._free_slot()
        await marking
        await self._record(items, result)

    async def _mark_jobs(self, items: list[BatchItem]) -> None:
        """Mark the jobs handed to the handler with this batch; never fails it."""
        jobs = [(item.job_id, item.attempt) for item in items]
        task = next(iter(self.jobs.values())).task_name
        try:
            async with asyncio.timeout(MARK_TIMEOUT):
                await self._mark(self.batch_id, task, items[0].queue, jobs)
        except Exception as exc:
            log.warning(
                "batch not marked on its jobs; it runs all the same",
                batch_id=self.batch_id,
                task=task,
                jobs=len(jobs),
                error=repr(exc),
            )

    async def _wait_thread(self, holder: Any) -> None:
        # A thread told to stop still runs: its slot stays taken until it returns.
        if holder.linger is not None:
            try:
                await asyncio.wrap_future(holder.linger)
            except asyncio.CancelledError:
                raise
            except BaseException:
                pass

    async def _stopped(self, reason: str) -> None:
        """Every member was cancelled: hand back those shutdown stopped; the
        others' rows are cancelled or no longer this worker's (nothing to write)."""
        back = [job_id for job_id in self.handed_back if job_id in self.jobs]
        if back:
            try:
                await self._release(back)
            finally:
                log.info(
                    "batch handed back at shutdown",
                    event_type="released",
                    task=next(iter(self.jobs.values())).task_name,
                    jobs=len(back),
                )
        for job_id in self.jobs:
            self._done(job_id, "handed_back" if job_id in back else "cancelled")

    async def _record(self, items: list[BatchItem], result: Any) -> None:
        if not isinstance(result, list | tuple) or len(result) != len(items):
            got = (
                f"{len(result)} results"
                if isinstance(result, list | tuple)
                else f"{type(result).__name__}"
            )
            message = (
                f"the batch handler returned {got} for {len(items)} jobs; "
                "it must return a list with one result per job, in order"
            )
            await self._fail_all(message, None)
            return
        # (job, error, traceback, final): written after the completions are queued.
        failures: list[tuple[ClaimedJob, str, str | None, bool]] = []
        for item, value in zip(items, result, strict=True):
            job = self.jobs[item.job_id]
            if item.cancelled:
                self._done(item.job_id, "cancelled")
            elif isinstance(value, BaseException):
                trace = None
                if value.__traceback__ is not None:
                    trace = "".join(tb.format_exception(value))
                failures.append((job, f"{type(value).__name__}: {value}", trace, False))
            else:
                try:
                    encoded, note = encode_result(value)
                except UnstorableResult as exc:
                    # Not a retry: the same handler would return the same result.
                    failures.append((job, str(exc), None, True))
                    continue
                if note:
                    log.warning(note, **self.outcomes.fields(job))
                self._queue(Completion(job.job_id, job.attempt, encoded), self._completed, job)
        for job, message, trace, final in failures:
            await self._fail(job, message, trace, final=final)

    def _completed(self, job: ClaimedJob, written: Any) -> None:
        """The completer wrote (or gave up on) one job's completion."""
        try:
            outcome = self.outcomes.completed(job, written, self.duration)
        except Exception as exc:  # a logging bug: the job is settled all the same
            log.error("settling a batch job failed", error=repr(exc))
            outcome = "lost"
        self._done(job.job_id, outcome)

    async def _fail_all(self, message: str, trace: str | None) -> None:
        for job_id, job in self.jobs.items():
            if self.items[job_id].cancelled:
                self._done(job_id, "cancelled")
            else:
                await self._fail(job, message, trace)

    async def _fail(
        self,
        job: ClaimedJob,
        message: str,
        trace: str | None,
        duration: float | None = None,
        final: bool = False,
    ) -> None:
        outcome = "lost"
        try:
            outcome = await self.outcomes.failed(
                job, message, trace, duration or self.duration or 0.0, final
            )
        except Exception as exc:
            # Not written (the database is gone): the lease expires and the
            # rescuer returns the job.
            log.error("failed attempt not written", job_id=job.job_id, error=repr(exc))
        finally:
            self._done(job.job_id, outcome)

    def _done(self, job_id: str, outcome: str) -> None:
        observed = self.observed.pop(job_id, None)
        if observed:
            try:
                instrument.finished(observed, outcome, self.duration)
            except Exception as exc:  # an observer's bug
                log.error("job observer failed", error=repr(exc))
        self._settled(job_id)
