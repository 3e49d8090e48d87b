"""One run of a workflow, for the executor: take its records (those of a
run that started before come with its claim; the others are read in one
statement for the runs starting together: loader.py), call the function
with a context, and end the run.

The run ends in one of five ways: the function returned (the executor
completes the job as any other; spawns still kept are written first, and
records the run did not reach are a :class:`~.errors.WorkflowMismatch`); it
raised (a failed attempt, retried by the workflow's own policy, replaying
what was recorded); it parked (:class:`~.errors.Parked`: the executor lets
the job go, nothing to write); one of its writes found the job no longer
its own (:class:`~.errors.LeaseLost`: it stops, as on a lost lease); or one
of its own statements lost its connection to the database
(:class:`~.errors.Interrupted`: the executor hands the job back as a rescue). Once the
run parked, lost its job or met a mismatch, it ends so whatever the function
does afterwards.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from ..enums import DEFAULT_QUEUE
from ..store import Store
from ..store.workflow_sql import RESUME_MOST
from ..store.workflows import Lease, Loaded, WorkflowStore
from ..support.reconnect import is_connection_error, retry_on_disconnect
from ..tasks import TaskRegistry
from .context import WorkflowContext
from .decorator import options_of
from .errors import LeaseLost, WorkflowMismatch, WorkflowTimeout
from .loader import Loader
from .replay import Replay, describe
from .run import WRITE_PATIENCE, RunState, interruption

#: Seconds before its wake time a parked workflow is made pending (by the
#: timer service, or by the park itself when the wake is this near): the
#: claim's own wait for due jobs then wakes a worker at that very time.
WAKE_LOOKAHEAD = 2.0

_stores: weakref.WeakKeyDictionary[Store, WorkflowStore] = weakref.WeakKeyDictionary()
_loaders: weakref.WeakKeyDictionary[WorkflowStore, Loader] = weakref.WeakKeyDictionary()


def workflow_store(store: Store) -> WorkflowStore:
    """The workflow statements for ``store``'s pool and schema (built once)."""
    found = _stores.get(store)
    if found is None:
        found = _stores[store] = WorkflowStore(store.pool, store.schema)
    return found


def _loader(store: WorkflowStore) -> Loader:
    found = _loaders.get(store)
    if found is None:
        found = _loaders[store] = Loader(store)
    return found


def _claimed_records(row: Mapping[str, Any]) -> Loaded | None:
    """The run's records as its claim returned them (store/workflow_sql.py
    RESUME_COLUMNS); None: the claim returned none, or not all of them."""
    resume = row.get("resume")
    if resume is None:
        return None
    steps = json.loads(row["resume_steps"])
    if len(steps) > RESUME_MOST:
        return None
    return Loaded(resume[0], resume[1], resume[2], steps)


class _RunTimeout(TimeoutError):
    """The scheduler's job_timeout ended this run (a failed attempt, retried)."""


async def run_workflow(
    func: Callable[..., Any],
    *,
    store: Store,
    registry: TaskRegistry,
    worker_id: str,
    job_id: str,
    attempt: int,
    task: str,
    row: Mapping[str, Any],
    args: list[Any] | tuple,
    kwargs: dict[str, Any],
    job_timeout: float | None,
) -> Any:
    """Run ``func(ctx, *args, **kwargs)`` as the run of job ``job_id`` held by
    ``worker_id`` at ``attempt``; its return value is the job's result."""
    wstore = workflow_store(store)
    lease = Lease(job_id, worker_id, attempt)
    timeout = row.get("timeout")
    if timeout is None:
        timeout = options_of(func).timeout
    try:
        loaded = _claimed_records(row)
        if loaded is None:
            loaded = await _loader(wstore).load(job_id)
        if loaded is None:
            raise LeaseLost(f"job {job_id} no longer exists")
        deadline = loaded.deadline
        if timeout is not None and deadline is None:
            # The first run of a workflow with a timeout: it counts from now.
            seconds = float(timeout)
            deadline = await retry_on_disconnect(
                lambda: wstore.set_deadline(wstore.pool, lease, seconds),
                what="workflow deadline",
                give_up_after=WRITE_PATIENCE,
            )
            if deadline is None:
                raise LeaseLost(f"job {job_id} is no longer this run's")
    except Exception as exc:
        # The database stayed unreachable past the writes' patience.
        if is_connection_error(exc):
            raise interruption(job_id, exc) from exc
        raise
    run = RunState(
        wstore,
        lease,
        Replay(loaded.steps),
        incarnation=loaded.incarnation,
        db_now=loaded.db_now,
        deadline=deadline,
        queue=row.get("queue") or DEFAULT_QUEUE,
        priority=row.get("priority") or 5,
        registry=registry,
        lookahead=WAKE_LOOKAHEAD,
    )
    context = WorkflowContext(run, task=task, attempt=attempt)
    remaining = None if deadline is None else (deadline - loaded.db_now).total_seconds()
    if remaining is not None and remaining <= 0:
        raise _deadline_error(timeout)
    limit = min((t for t in (remaining, job_timeout) if t is not None), default=None)
    timer = None
    try:
        if limit is None:
            result = await _call(run, context, func, args, kwargs)
        else:
            async with asyncio.timeout(limit) as timer:
                result = await _call(run, context, func, args, kwargs)
    except TimeoutError:
        if timer is None or not timer.expired() or run.stop is not None:
            raise
        if limit == remaining:
            raise _deadline_error(timeout) from None
        raise _RunTimeout(f"timed out after {limit:g} s (job_timeout: one run)") from None
    return result


async def _call(
    run: RunState,
    context: WorkflowContext,
    func: Callable[..., Any],
    args: list[Any] | tuple,
    kwargs: dict[str, Any],
) -> Any:
    try:
        result = await func(context, *args, **kwargs)
    except BaseException as exc:
        if run.stop is not None and run.stop is not exc:
            # Parked, lost or mismatched: that is how the run ends, whatever
            # the function made of it.
            raise run.stop from exc
        raise
    run.check()
    await context._flush()
    left = run.replay.left_over()
    if left:
        first = left[0]
        raise run.halt(
            WorkflowMismatch(
                f"the workflow returned after {run.replay.next_seq - 1} step(s) but "
                f"{len(left)} more were recorded, from step {first.seq} "
                f"({describe(first.kind, first.name, first.key)}); its code changed while "
                "it ran"
            )
        )
    return result


def _deadline_error(timeout: float | None) -> WorkflowTimeout:
    what = "its timeout" if timeout is None else f"its timeout of {float(timeout):g} s"
    return WorkflowTimeout(f"workflow timed out: {what} counts from its first start")
