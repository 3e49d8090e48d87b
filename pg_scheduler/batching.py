"""Batch tasks: what ``@task(batch_size=..., batch_timeout=...)`` declares, and
what the handler of a batch receives.

A batch task's jobs are scheduled one by one, as any job; a worker hands its
function a list of up to ``batch_size`` of them (:class:`BatchItem`, one per
job, all of one task and one queue), waiting at most ``batch_timeout`` after
the earliest due job for the batch to fill. Each job keeps its own row,
attempts, retry policy and result (docs: Batch tasks). The engine's side is
:mod:`pg_scheduler.engine.batch`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .enums import DEFAULT_QUEUE

#: Set on a batch task's function at registration: its :class:`BatchOptions`.
BATCH_ATTR = "__pg_scheduler_batch__"
#: The most jobs one batch may hold (one claim statement, one list in memory).
MAX_BATCH_SIZE = 10_000
#: How long a batch waits to fill when ``batch_timeout`` is not given (seconds).
DEFAULT_BATCH_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """A batch task's options, checked: ``size`` jobs at most per call,
    ``timeout`` seconds at most after the earliest due job."""

    size: int
    timeout: float


@dataclass(slots=True, eq=False)
class BatchItem:
    """One job of a batch, as the handler receives it.

    ``args`` and ``kwargs`` are the arguments the job was scheduled with
    (decoded from JSON: tuples come back as lists); ``arg`` is the first
    positional argument (the usual shape: one argument per job). ``attempt``
    counts from 1. ``cancelled`` becomes True while the handler runs if the
    job is cancelled (``cancel_job``) or its lease is lost: whatever the
    handler returns for it is then not recorded.
    """

    job_id: str
    args: list[Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    queue: str = DEFAULT_QUEUE
    cancelled: bool = False

    @property
    def arg(self) -> Any:
        """The job's first positional argument (None when it has none)."""
        return self.args[0] if self.args else None


def check_batch_options(batch_size: Any, batch_timeout: Any) -> BatchOptions | None:
    """The options ``@task(batch_size=..., batch_timeout=...)`` declare, checked:
    None when neither is given; TypeError/ValueError naming the problem."""
    if batch_size is None:
        if batch_timeout is not None:
            raise ValueError("batch_timeout is an option of batch tasks: give batch_size too")
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an int, got {batch_size!r}")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"batch_size must be between 1 and {MAX_BATCH_SIZE}, got {batch_size}")
    if batch_timeout is None:
        seconds = DEFAULT_BATCH_TIMEOUT
    elif isinstance(batch_timeout, timedelta):
        seconds = batch_timeout.total_seconds()
    elif isinstance(batch_timeout, int | float) and not isinstance(batch_timeout, bool):
        seconds = float(batch_timeout)
    else:
        raise TypeError(
            f"batch_timeout must be a timedelta or a number of seconds, got {batch_timeout!r}"
        )
    if not 0 <= seconds < 86_400:  # NaN fails too
        raise ValueError(f"batch_timeout must be between 0 and one day, got {batch_timeout!r}")
    return BatchOptions(batch_size, seconds)


def check_batch_task(func: Any, kind: Any, executor: Any, limited: bool) -> None:
    """Refuse what a batch task cannot be: a workflow, a process job (its list
    crosses no process boundary here), a task under ``max_running`` or
    ``rate_limit`` (they count jobs one by one; a batch claims many at once),
    a function that takes no argument (it takes the list). ``kind``: how the
    function is marked to run already ("workflow" for a workflow)."""
    if kind == "workflow":
        raise TypeError("a workflow cannot be a batch task: batch_size is an option of @task")
    if executor == "process":
        raise ValueError('a batch task runs on the loop or in a thread, not executor="process"')
    if limited:
        raise ValueError(
            "max_running and rate_limit count jobs one by one; a batch task cannot have them"
        )
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return
    try:
        signature.bind([])
    except TypeError:
        raise TypeError(
            f"a batch task's function takes the batch (one list) as its argument, got "
            f"{func.__qualname__}{signature}"
        ) from None


def batch_options_of(func: Any) -> BatchOptions | None:
    """A registered function's batch options (None: not a batch task)."""
    return getattr(func, BATCH_ATTR, None)
