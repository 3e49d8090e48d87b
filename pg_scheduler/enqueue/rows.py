"""schedule_bulk's rows: each ``JobSpec`` checked again and made a row, cheaply in bulk.

The per-row cost of a bulk enqueue is mostly here, so the loop is written
for the common bulk: one function, one time and one set of options repeated.
Each distinct value (by identity: times, priorities, numbers, names and None
are immutable) is checked and converted once per call, then reused; every
row still meets every check ``schedule()`` makes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import pg_scheduler.observe.instrument as instrument

from ..config import UNSET
from ..enums import PRIORITY_DB_VALUE_OF
from ..job_spec import JobSpec
from ..store import NewJob
from ..support.codec import encode_retry_policy, encode_task_data
from ..support.validation import check_queue
from ..tasks import queue_of
from ..workflows.decorator import is_workflow
from . import queue_keys
from .arguments import check_arguments
from .checks import (
    check_job_id,
    check_max_retries,
    check_misfire_grace_time,
    check_priority,
    check_retry_policy,
    check_timeout,
    check_when,
    when_of,
)
from .dedupe import has_task_key
from .dedupe import resolve as resolve_dedupe
from .fair import has_task_key as has_fair_key
from .ids import new_job_ids
from .keys import NO_KEY, wants_keys
from .keys import resolve as resolve_keys
from .timing import has_task_timing

# schedule_bulk batches at least this large are written with COPY (generated ids only).
COPY_THRESHOLD = 100

# NewJob without its Python-level __new__ (15 arguments): a third of a row's build.
_new_row = tuple.__new__
_NOT_SEEN: Any = object()


def _refuse_timing(index: int, why: str) -> None:
    raise ValueError(
        f"jobs[{index}]: schedule_bulk does not debounce or throttle ({why}); "
        "schedule such jobs one by one with schedule(); nothing was scheduled"
    )


def streamable(jobs: Sequence[Any]) -> bool:
    """Whether a bulk may stream into one COPY as it is checked: many plain
    specs with generated ids and no dedupe key (keyed rows need ON CONFLICT)."""
    if len(jobs) < COPY_THRESHOLD:
        return False
    keyed: dict[Any, bool] = {}
    for spec in jobs:
        if (
            type(spec) is not JobSpec
            or spec.job_id is not None
            or spec.dedupe_key is not None
            or spec.dedupe_scope is not None
        ):
            return False
        func = spec.func
        task_keyed = keyed.get(func)
        if task_keyed is None:
            task_keyed = keyed[func] = has_task_key(func)
        if task_keyed:
            return False
    return True


def spec_rows(
    jobs: Sequence[JobSpec],
    register: Callable[[Callable[..., Any]], str],
    default_grace: Callable[[], int | None],
) -> Iterator[NewJob]:
    """The row of each spec, in order, checked again (a spec may have changed
    since it was built); TypeError/ValueError at the first bad one, with the
    fields checked in ``schedule()``'s order. ``register``: checks and
    registers a function, returns its task name."""
    return cast(Iterator[NewJob], _rows(jobs, register, default_grace, None, True))


def spec_tuples(
    jobs: Sequence[JobSpec],
    register: Callable[[Callable[..., Any]], str],
    default_grace: Callable[[], int | None],
    into: list[tuple[Any, ...]],
) -> Iterator[tuple[Any, ...]]:
    """``spec_rows`` as plain tuples (NewJob's column order), for COPY, each
    appended to ``into`` as it is made (the streamed COPY replays them after
    a lost connection). The collector stops tracking a plain tuple of
    scalars at its first pass but never a NewJob: 100,000 NewJobs kept
    for the COPY cost a full collection, about a microsecond a row."""
    return _rows(jobs, register, default_grace, into, False)


def _rows(
    jobs: Sequence[JobSpec],
    register: Callable[[Callable[..., Any]], str],
    default_grace: Callable[[], int | None],
    into: list[tuple[Any, ...]] | None,
    named: bool,
) -> Iterator[tuple[Any, ...]]:
    keep = into.append if into is not None else None
    declared = queue_keys.DECLARED
    # func -> (job name, task name, has a task-level dedupe key, its queue,
    # has a task-level fair share key)
    tasks: dict[Any, tuple[str, str, bool, str, bool]] = {}
    fresh_ids = iter(new_job_ids(len(jobs)))
    inject = instrument.trace_injector  # the caller's trace context
    grace_default: Any = UNSET
    last_time = last_priority = last_retries = last_grace = last_timeout = last_queue = _NOT_SEEN
    last_delay: Any = _NOT_SEEN
    # One "now" for the call: every spec without a time (or with a delay) counts from it.
    now = datetime.now(UTC)
    aware: Any = None
    db_priority = 0
    grace: Any = None
    timeout: float | None = None
    value: Any  # the field being checked (each field's own type)
    for index, spec in enumerate(jobs):
        if not isinstance(spec, JobSpec):
            raise TypeError(f"jobs[{index}] must be a JobSpec, got {type(spec).__name__}")
        value = spec.execution_time
        delay = spec.delay
        if value is not last_time or delay is not last_delay:
            check_when(value, delay)
            aware = when_of(value, delay, now)
            last_time, last_delay = value, delay
        value = spec.priority
        if value is not last_priority:
            check_priority(value)
            db_priority = PRIORITY_DB_VALUE_OF[value]
            last_priority = value
        retries = spec.max_retries
        if retries is not last_retries:
            check_max_retries(retries)
            last_retries = retries
        job_id = spec.job_id
        if job_id is not None:
            check_job_id(job_id)
        value = spec.misfire_grace_time
        if value is not last_grace:
            check_misfire_grace_time(value)
            if value is UNSET:
                if grace_default is UNSET:
                    grace_default = default_grace()
                grace = grace_default
            else:
                grace = value
            last_grace = value
        value = spec.timeout
        if value is not last_timeout:
            check_timeout(value)
            timeout = None if value is None else float(value)
            last_timeout = value
        value = spec.retry_policy
        policy = None
        if value is not None:
            check_retry_policy(value)
            policy = encode_retry_policy(value)
        func = spec.func
        task = tasks.get(func)
        if task is None:
            task_name = register(func)
            timed = has_task_timing(func)
            task = tasks[func] = (
                func.__name__,
                task_name,
                has_task_key(func),
                queue_of(func),
                has_fair_key(func),
            )
            if timed:
                _refuse_timing(index, "its task debounces or throttles its jobs")
        job_name, task_name, keyed_task, queue, fair_task = task
        if (
            spec.debounce is not None
            or spec.throttle is not None
            or spec.debounce_max_wait is not None
        ):
            _refuse_timing(index, "it gives debounce or throttle")
        if spec.queue is not None:
            queue = spec.queue
            if queue is not last_queue:
                check_queue(queue)
                last_queue = queue
        task_data = encode_task_data(spec.args, spec.kwargs, task_name)
        check_arguments(func, spec.args, spec.kwargs)
        key = scope = None
        if keyed_task or spec.dedupe_key is not None or spec.dedupe_scope is not None:
            key, scope = resolve_dedupe(
                func, spec.dedupe_key, spec.dedupe_scope, spec.args, spec.kwargs
            )
        defaults = declared.get(queue) if declared else None  # a queue's key defaults
        keys = NO_KEY
        if defaults is not None or wants_keys(spec, func):
            keys = resolve_keys(
                func,
                spec,
                spec.args,
                spec.kwargs,
                defaults,
                defaults is not None and (fair_task or spec.fair_share_key is not None),
            )
        fair_key = fair_weight = None
        if (
            fair_task
            or defaults is not None
            or spec.fair_share_key is not None
            or spec.fair_share_weight is not None
        ):
            fair_key, fair_weight = queue_keys.fair_of(
                func, spec, spec.args, spec.kwargs, defaults, keys
            )
        if inject is not None:  # a workflow without a current span: a trace of its own
            task_data = inject(task_data, f"schedule {task_name}" if is_workflow(func) else None)
        row = (
            next(fresh_ids) if job_id is None else job_id,
            job_name,
            task_name,
            aware,
            task_data,
            db_priority,
            retries,
            grace,
            timeout,
            policy,
            key,
            scope,
            queue,
            *keys,
            fair_key,
            fair_weight,
        )
        if named:
            row = _new_row(NewJob, row)
        if keep is not None:
            keep(row)
        yield row
