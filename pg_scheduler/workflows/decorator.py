"""``@workflow``: an ``async def`` taking a :class:`WorkflowContext` first,
registered as a task like ``@task`` registers one (the same keywords where
they apply), and marked so the executor runs it as a workflow."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, overload

from ..limits import RateLimit
from ..support.validation import check_seconds
from ..tasks import EXECUTOR_ATTR, TaskOptions, default_registry

F = TypeVar("F", bound=Callable[..., Any])

#: The executor kind of a workflow (read from EXECUTOR_ATTR, as "thread" and "process").
WORKFLOW = "workflow"
OPTIONS_ATTR = "__pg_scheduler_workflow__"


@dataclass(frozen=True, slots=True)
class WorkflowOptions:
    #: Seconds the workflow may take from its first start, across parks
    #: (a job's own ``timeout`` given to ``schedule()`` takes precedence).
    timeout: float | None = None


def is_workflow(func: Any) -> bool:
    return getattr(func, EXECUTOR_ATTR, None) == WORKFLOW


def options_of(func: Any) -> WorkflowOptions:
    return getattr(func, OPTIONS_ATTR, None) or WorkflowOptions()


def mark_workflow(func: F, options: WorkflowOptions) -> F:
    """Make ``func`` (``async def f(ctx, ...)``) run as a workflow once registered."""
    setattr(func, EXECUTOR_ATTR, WORKFLOW)
    setattr(func, OPTIONS_ATTR, options)
    return func


@overload
def workflow(func: F, /) -> F: ...
@overload
def workflow(
    *,
    name: str | None = None,
    queue: str | None = None,
    max_running: int | None = None,
    rate_limit: str | RateLimit | None = None,
    dedupe_key: str | Callable[..., str] | None = None,
    dedupe_scope: str | None = None,
    concurrency_key: str | Callable[..., str] | None = None,
    max_running_per_key: int | None = None,
    rate_limit_per_key: str | None = None,
    ordered: bool = False,
    timeout: timedelta | float | None = None,
    debounce: timedelta | float | None = None,
    debounce_max_wait: timedelta | float | None = None,
    debounce_merge: Callable[[Any, Any], Any] | None = None,
    throttle: timedelta | float | None = None,
    fair_share_key: str | Callable[..., str] | None = None,
    fair_share_weight: float | None = None,
) -> Callable[[F], F]: ...
def workflow(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    queue: str | None = None,
    max_running: int | None = None,
    rate_limit: str | RateLimit | None = None,
    dedupe_key: str | Callable[..., str] | None = None,
    dedupe_scope: str | None = None,
    concurrency_key: str | Callable[..., str] | None = None,
    max_running_per_key: int | None = None,
    rate_limit_per_key: str | None = None,
    ordered: bool = False,
    timeout: timedelta | float | None = None,
    debounce: timedelta | float | None = None,
    debounce_max_wait: timedelta | float | None = None,
    debounce_merge: Callable[[Any, Any], Any] | None = None,
    throttle: timedelta | float | None = None,
    fair_share_key: str | Callable[..., str] | None = None,
    fair_share_weight: float | None = None,
) -> Any:
    """Register ``async def f(ctx, ...)`` as a durable workflow (docs: Durable
    workflows). Schedule it like any task (``scheduler.schedule(f, args=...)``);
    ``ctx`` is not one of the stored arguments. ``name``, ``queue``,
    ``max_running``, ``rate_limit``, ``dedupe_key``, ``dedupe_scope`` as for
    ``@task`` (its options but ``executor``: a workflow runs on the loop);
    ``timeout``: the whole workflow's, from its first start across every park
    (it then fails without a retry)."""
    task_options = TaskOptions.of(locals())
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    check_seconds("timeout", timeout)
    options = WorkflowOptions(None if timeout is None else float(timeout))

    def decorate(f: F) -> F:
        if not inspect.iscoroutinefunction(f):
            raise TypeError(
                f"@workflow needs an async def function taking the context first, got {f!r}"
            )
        mark_workflow(f, options)
        decorated: F = default_registry.decorator(f, task_options)
        return decorated

    return decorate(func) if func is not None else decorate
