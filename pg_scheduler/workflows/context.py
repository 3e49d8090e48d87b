"""The context a workflow receives first: ``ctx.step``, ``ctx.transaction``,
``ctx.sleep``, ``ctx.wait_for_signal``, ``ctx.spawn``, ``ctx.wait`` and
``ctx.gather``. Each call takes the next place in the workflow's record (see
replay.py); the work itself is in steps, transactions, parking and children."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

import asyncpg

from ..config import RetryPolicy
from ..enqueue.fields import JobOptions
from ..enums import JobPriority
from ..store.workflows import Spawned
from ..support.timeutil import human_seconds, to_aware
from ..support.validation import check_name
from .children import SPAWN_DEFAULTS, ChildHandle, flush, result_of
from .children import replayed as replayed_child
from .children import spawn as spawn_child
from .children import wait as wait_children
from .errors import WaitTimeout
from .parking import sleep as park_sleep
from .parking import wait_for_signal as park_for_signal
from .run import RunState
from .signals import checked_signal, own_signal_key, send_signal
from .steps import StepRetry, check_step_options, run_step
from .transactions import TransactionStep, transaction_step

_NO_DEFAULT: Any = object()


def _name(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what} must be a non-empty str, got {value!r}")
    check_name(what, value)
    return value


def _key(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f"key must be a str or an int, got {value!r}")
    key = str(value)
    check_name("key", key)
    return key


def _seconds(what: str, value: Any, allow_zero: bool = False) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a timedelta or a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{what} must be a finite, positive duration, got {human_seconds(value)}")
    return float(value)


class _Transaction:
    """``ctx.transaction()``: writes the spawns kept so far, then the step."""

    def __init__(self, context: WorkflowContext, name: str | None, key: Any) -> None:
        self._context = context
        self._name = name
        self._key = key
        self._step: TransactionStep | None = None

    async def __aenter__(self) -> asyncpg.Connection:
        context = self._context
        await context._flush()
        run = context._run
        if self._name is None:
            name, key = "transaction", str(run.replay.next_seq)
        else:
            name, key = self._name, _key(self._key)
        self._step = TransactionStep(run, name, key)
        return await self._step.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._step is not None
        await self._step.__aexit__(exc_type, exc, tb)


class WorkflowContext:
    """What a workflow function receives as its first argument."""

    def __init__(self, run: RunState, *, task: str, attempt: int) -> None:
        self._run = run
        self._spawns: list[Spawned] = []
        self._task = task
        self._attempt = attempt

    @property
    def job_id(self) -> str:
        """The workflow's job id (the same in every run)."""
        return self._run.lease.job_id

    @property
    def task(self) -> str:
        return self._task

    @property
    def attempt(self) -> int:
        """The job's attempt: a park and its wake-up are not attempts."""
        return self._attempt

    def now(self) -> datetime:
        """The database's clock (as of this run's start, advanced locally). Not
        replayed: record a time in a step if the workflow decides by it."""
        return self._run.now()

    async def _flush(self) -> None:
        if self._spawns:
            await flush(self._run, self._spawns)

    # -- steps -----------------------------------------------------------------------

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        key: str | int | None = None,
        retry: StepRetry | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """``fn(*args, **kwargs)`` (a function or a coroutine function) once: its
        result is stored as JSON, and returned as the JSON decodes, on this run
        and every later one. ``key``: for steps in a loop (a name and key
        identify a step). ``retry``: its own retries; ``timeout``: seconds per
        attempt. After its last attempt it raises :class:`StepFailed`."""
        name = _name("step name", name)
        if not callable(fn):
            raise TypeError(f"step {name!r}: fn must be callable, got {fn!r}")
        check_step_options(retry, timeout)
        step_key = _key(key)
        await self._flush()
        return await run_step(self._run, name, step_key, fn, args, kwargs, retry, timeout)

    def transaction(self, name: str | None = None, *, key: str | int | None = None) -> Any:
        """``async with ctx.transaction() as conn:`` a transaction on a connection
        of the application's pool, committed together with this step's record:
        its writes happen exactly once. On a replay the block runs again and is
        rolled back: put only database writes through ``conn`` in it."""
        if name is not None:
            _name("transaction name", name)
        elif key is not None:
            raise TypeError("a transaction's key= needs a name=")
        return _Transaction(self, name, key)

    async def transaction_step(
        self,
        name: str,
        fn: Callable[[asyncpg.Connection], Awaitable[Any]],
        *,
        key: str | int | None = None,
    ) -> Any:
        """``await fn(conn)`` in a transaction committed with its record, exactly
        once; its result stored like a step's. Not called at all on a replay."""
        name = _name("transaction name", name)
        if not callable(fn):
            raise TypeError(f"transaction step {name!r}: fn must be callable, got {fn!r}")
        step_key = _key(key)
        await self._flush()
        return await transaction_step(self._run, name, step_key, fn)

    # -- parking ---------------------------------------------------------------------

    async def sleep(self, delay: timedelta | float) -> None:
        """Park for ``delay`` (a timedelta or seconds), measured by the database's
        clock. The workflow holds no slot, connection or lease meanwhile."""
        seconds = _seconds("delay", delay, allow_zero=True)
        await self._flush()
        await park_sleep(self._run, seconds, None)

    async def sleep_until(self, when: datetime) -> None:
        """Park until ``when`` (an aware datetime; a naive one is UTC)."""
        if not isinstance(when, datetime):
            raise TypeError(f"when must be a datetime, got {when!r}")
        await self._flush()
        await park_sleep(self._run, None, to_aware(when))

    async def wait_for_signal(
        self,
        name: str,
        *,
        timeout: timedelta | float | None = None,
        default: Any = _NO_DEFAULT,
        key: str | int | None = None,
    ) -> Any:
        """The payload of the next signal ``name`` (``scheduler.signal(job_id,
        name, payload)``): one sent before this wait is taken at once, the
        oldest first; each wait takes one. Parks until it comes. After
        ``timeout``: ``default`` if given, else :class:`WaitTimeout`."""
        name = _name("signal name", name)
        seconds = None if timeout is None else _seconds("timeout", timeout)
        wait_key = None if key is None else _key(key)
        await self._flush()
        came, payload = await park_for_signal(self._run, name, wait_key, seconds)
        if came:
            return payload
        if default is not _NO_DEFAULT:
            return default
        raise WaitTimeout(name)

    async def signal(
        self, job_id: str, name: str, payload: Any = None, *, key: str | int | None = None
    ) -> None:
        """Send workflow ``job_id`` the signal ``name`` (as ``scheduler.signal``),
        exactly once: a step named ``signal <name> to <job_id>`` (``key`` for
        one in a loop), whose signal carries an idempotency key of this
        workflow's own, so a run that sends it again (its worker died before
        the step's record) stores nothing. A refused signal (an unknown or
        finished job) fails the step: :class:`StepFailed`."""
        checked_signal(job_id, name, payload)
        step_key = _key(key)
        await self._flush()
        # The place this step takes (run_step takes the next one): the same in
        # every run of the workflow, which replays its steps in order.
        once = own_signal_key(self.job_id, self._run.replay.next_seq)
        store = self._run.store

        async def send() -> None:
            await send_signal(store, job_id, name, payload, idempotency_key=once)

        step = f"signal {name} to {job_id}"
        await run_step(self._run, step, step_key, send, (), {}, None, None)

    async def signals(self, name: str) -> AsyncIterator[Any]:
        """Every signal ``name``, in the order sent: ``async for payload in
        ctx.signals("events")`` (each one a wait; break out to stop)."""
        while True:
            yield await self.wait_for_signal(name)

    # -- children --------------------------------------------------------------------

    def spawn(
        self,
        func: Callable[..., Any],
        /,
        *args: Any,
        queue: str | None = None,
        priority: JobPriority | None = None,
        detached: bool = False,
        max_retries: int = 0,
        timeout: float | None = None,
        retry_policy: RetryPolicy | None = None,
        concurrency_key: str | None = None,
        max_running_per_key: int | None = None,
        rate_limit_per_key: str | None = None,
        ordered: bool = False,
        fair_share_key: str | None = None,
        fair_share_weight: float | None = None,
        **kwargs: Any,
    ) -> ChildHandle:
        """A child job ``func(*args, **kwargs)``: a normal job linked to this
        workflow, spawned once whatever the number of runs. Queue and priority
        are this workflow's unless given (or the task's own queue). When this
        workflow ends, its unfinished children are cancelled, unless spawned
        ``detached=True``. Returns a handle (awaitable: ``await ctx.spawn(...)``
        works too); children spawned before a wait are written together. Of a
        job's options (JobOptions) a child takes these: its id is its parent's
        step's, it never expires unstarted and carries no dedupe key. Its
        concurrency or fair share key and limits are the call's, else its
        task's, else its queue's (``queue_keys``), as for ``schedule()``."""
        found = replayed_child(self._run, func)
        if found is not None:
            return found
        if (
            queue is None
            and priority is None
            and type(max_retries) is int
            and max_retries == 0
            and timeout is None
            and retry_policy is None
            and concurrency_key is None
            and max_running_per_key is None
            and rate_limit_per_key is None
            and ordered is False
            and fair_share_key is None
            and fair_share_weight is None
        ):
            options = SPAWN_DEFAULTS  # the common call: no JobOptions built
        else:
            options = JobOptions.of(locals())
        return spawn_child(self._run, self._spawns, func, args, kwargs, options, detached)

    async def wait(self, child: ChildHandle | Awaitable[ChildHandle]) -> Any:
        """The result of ``child`` once it ended (parks until then); raises
        JobFailed / JobCancelled / JobExpired as ``scheduler.result`` does."""
        handle = await _handle(child)
        ended = await wait_children(self._run, self._spawns, [handle], "wait")
        return result_of(handle, ended[0])

    async def gather(
        self, *spawned: ChildHandle | Awaitable[ChildHandle], return_exceptions: bool = False
    ) -> list[Any]:
        """The results of every child, in order, once all ended (the workflow is
        parked meanwhile). The first child (in the order given) that did not
        complete raises its JobFailed / JobCancelled / JobExpired, unless
        ``return_exceptions``: then it takes that child's place in the list."""
        handles = [await _handle(s) for s in spawned]
        if not handles:
            return []
        ended = await wait_children(self._run, self._spawns, handles, "gather")
        results: list[Any] = []
        for handle, outcome in zip(handles, ended, strict=True):
            try:
                results.append(result_of(handle, outcome))
            except Exception as exc:
                if not return_exceptions:
                    raise
                results.append(exc)
        return results


async def _handle(value: Any) -> ChildHandle:
    if isinstance(value, ChildHandle):
        return value
    if hasattr(value, "__await__"):
        value = await value
    if not isinstance(value, ChildHandle):
        raise TypeError(f"expected a child of ctx.spawn(), got {value!r}")
    return value
