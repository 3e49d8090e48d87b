"""Task registry: a stable task name <-> the async callable that runs it.

Jobs are routed by ``task_name`` (``module:qualname``), not by the bare
``__name__`` that pg-scheduler 0.2.x stored in ``job_name``: two modules'
``send`` functions never collide. A worker claims only jobs whose task name
it has registered, so a job nobody here can run waits for a worker that can.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, TypeVar, overload

from .batching import BATCH_ATTR, check_batch_options, check_batch_task
from .enqueue.dedupe import mark_task
from .enqueue.fair import mark_task as mark_fair_task
from .enqueue.keys import check_task_keys
from .enqueue.keys import mark_task as mark_keys
from .enqueue.timing import mark_task as mark_timing
from .enums import DEFAULT_QUEUE
from .limits import Limits, RateLimit
from .support.validation import check_name, check_queue

F = TypeVar("F", bound=Callable[..., Any])

_TASK_NAME_ATTR = "__pg_scheduler_task_name__"
#: "thread" or "process" on a plain function registered to run there; the
#: The queue ``@task(queue=...)`` gave a function: its jobs' queue unless the
#: call that schedules one names another.
QUEUE_ATTR = "__pg_scheduler_queue__"
#: executor reads it once per job (absent on async functions).
EXECUTOR_ATTR = "__pg_scheduler_executor__"
EXECUTORS = ("async", "thread", "process")


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """The keywords of ``@task(...)`` and ``Scheduler.task(...)`` and their
    defaults: the one declaration. Both signatures list them for their users
    and hand them over with :meth:`of`; ``tests/unit/test_job_options.py`` holds
    them to this. Checked when registered (:meth:`TaskRegistry.decorator`)."""

    name: str | None = None
    executor: str | None = None
    dedupe_key: str | Callable[..., str] | None = None
    dedupe_scope: str | None = None
    max_running: int | None = None
    rate_limit: str | RateLimit | None = None
    queue: str | None = None
    concurrency_key: str | Callable[..., str] | None = None
    max_running_per_key: int | None = None
    rate_limit_per_key: str | None = None
    ordered: bool = False
    # Defaults of the task's jobs (docs/debounce-throttle.md): a call's
    # debounce or throttle replaces them; debounce_merge(previous, new)
    # combines a burst's arguments (enqueue/timing.py CallArguments).
    debounce: timedelta | float | None = None
    debounce_max_wait: timedelta | float | None = None
    debounce_merge: Callable[[Any, Any], Any] | None = None
    throttle: timedelta | float | None = None
    batch_size: int | None = None
    batch_timeout: timedelta | float | None = None
    # Fair share (docs/fair-share.md): every job's key, or a function of the
    # job's arguments returning it; and the jobs' weight (None: 1).
    fair_share_key: str | Callable[..., str] | None = None
    fair_share_weight: float | None = None

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> TaskOptions:
        """The options among ``values``: a decorator's ``locals()``, taken before
        it assigns any, hands over the keywords its signature lists."""
        return cls(**{name: values[name] for name in TASK_OPTION_NAMES if name in values})


TASK_OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(TaskOptions))


def queue_of(func: Any, queue: Any = None) -> str:
    """The queue of a job of ``func``: ``queue`` if given (checked), else the
    task's own, else "default"."""
    if queue is not None:
        return check_queue(queue)
    return getattr(func, QUEUE_ATTR, DEFAULT_QUEUE)


def task_name_of(func: Callable[..., Any]) -> str:
    """The routing name of ``func``: an explicit ``@task(name=...)`` or ``module:qualname``."""
    explicit = getattr(func, _TASK_NAME_ATTR, None)
    if explicit:
        return explicit
    return f"{func.__module__}:{func.__qualname__}"


def ensure_async(func: Any) -> None:
    """Raise TypeError unless ``func`` is an ``async def`` function (or a plain
    function registered with an executor)."""
    if getattr(func, EXECUTOR_ATTR, None) is not None:
        return
    if not inspect.iscoroutinefunction(func):
        raise TypeError(
            f"Expected an async function, got {func!r}; to run a plain function, "
            'register it with @task(executor="thread") (or executor="process")'
        )


def _check_executor(func: Any, executor: Any) -> str | None:
    """The executor a registration asks for (None: async), checked before anything is written."""
    if executor is not None and executor not in EXECUTORS:
        raise ValueError(
            f"executor must be one of {', '.join(map(repr, EXECUTORS))}, got {executor!r}"
        )
    if executor in (None, "async"):
        ensure_async(func)
        return None
    if inspect.iscoroutinefunction(func) or not callable(func):
        raise TypeError(f'executor="{executor}" runs a plain def function, got {func!r}')
    if executor == "process" and "<" in f"{func.__module__}:{func.__qualname__}":
        # The spawned process finds the function by module:qualname.
        raise ValueError(
            f'executor="process" needs a function importable by module:qualname, '
            f"got {func.__module__}:{func.__qualname__}"
        )
    return str(executor)


class TaskRegistry:
    """Name -> function map with an optional parent (the process-wide registry).

    Legacy rows written by pg-scheduler 0.2.x carry only the bare ``__name__``;
    such a name resolves when exactly one registered task has it.
    """

    def __init__(self, parent: TaskRegistry | None = None) -> None:
        self._parent = parent
        self._by_name: dict[str, Callable[..., Any]] = {}
        #: Limits declared in code (``@task(max_running=..., rate_limit=...)``),
        #: written to the database when a Scheduler starts.
        self.limits: dict[str, Limits] = {}
        self._listeners: list[Callable[[str], None]] = []
        if parent is not None:
            parent._listeners.append(self._notify)

    def register(
        self,
        func: F,
        name: str | None = None,
        executor: str | None = None,
        limits: Limits | None = None,
        queue: str | None = None,
    ) -> F:
        if name is None and executor is None and limits is None and queue is None:
            # Registered already, as it is (a spawn registers its function each time).
            if self._by_name.get(task_name_of(func)) is func:
                return func
        kind = _check_executor(func, executor)
        if queue is not None:
            check_queue(queue)
            setattr(func, QUEUE_ATTR, queue)
        if name is not None:
            if not isinstance(name, str) or not name:
                raise ValueError("task name must be a non-empty string")
            setattr(func, _TASK_NAME_ATTR, name)
        task_name = task_name_of(func)
        existing = self._by_name.get(task_name)
        if existing is func:
            if limits is not None and not limits.empty:
                self.limits[task_name] = limits
            return func
        # Both land in text columns of every job row (task_name, job_name).
        check_name("task name", task_name)
        check_name("job name (the function's __name__)", func.__name__)
        if kind is not None:
            setattr(func, EXECUTOR_ATTR, kind)
        self._by_name[task_name] = func
        if limits is not None and not limits.empty:
            self.limits[task_name] = limits
        self._notify(task_name)
        return func

    def decorator(self, func: Any, options: TaskOptions) -> Any:
        """What ``@task(...)`` and ``Scheduler.task(...)`` return: ``func``
        registered here, or a decorator that registers its function (limits
        checked at once, before any function is given)."""
        limits = Limits.of(options.max_running, options.rate_limit)
        check_task_keys(options)
        batch = check_batch_options(options.batch_size, options.batch_timeout)
        if not limits.empty and options.fair_share_key is not None:
            # The fair claim leaves limited groups to the limited claim, which
            # reads no keyed rows: such jobs would wait (docs/fair-share.md).
            raise ValueError("a task takes fair_share_key or global limits, not both")

        def decorate(f: F) -> F:
            if batch is not None:  # docs/batches.md
                kind = getattr(f, EXECUTOR_ATTR, None)
                check_batch_task(f, kind, options.executor, not limits.empty)
            mark_task(f, options.dedupe_key, options.dedupe_scope)
            mark_keys(f, options)
            mark_fair_task(f, options.fair_share_key, options.fair_share_weight)
            mark_timing(
                f,
                options.debounce,
                options.debounce_max_wait,
                options.debounce_merge,
                options.throttle,
            )
            try:
                if batch is not None:
                    # Before it is registered: a worker told of it claims it in batches.
                    setattr(f, BATCH_ATTR, batch)
                return self.register(
                    f,
                    name=options.name,
                    executor=options.executor,
                    limits=limits,
                    queue=options.queue,
                )
            except BaseException:
                if batch is not None and hasattr(f, BATCH_ATTR):
                    delattr(f, BATCH_ATTR)
                raise

        return decorate(func) if func is not None else decorate

    def all_limits(self) -> dict[str, Limits]:
        """Declared limits of every task here and in the parent registry."""
        merged = dict(self._parent.all_limits()) if self._parent is not None else {}
        merged.update(self.limits)
        return merged

    def _notify(self, task_name: str) -> None:
        for listener in list(self._listeners):
            listener(task_name)

    def add_listener(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(task_name)`` whenever a task becomes known here."""
        self._listeners.append(callback)

    def _all(self) -> dict[str, Callable[..., Any]]:
        merged = dict(self._parent._all()) if self._parent else {}
        merged.update(self._by_name)
        return merged

    def get(self, task_name: str) -> Callable[..., Any] | None:
        func = self._by_name.get(task_name)
        if func is None and self._parent is not None:
            func = self._parent.get(task_name)
        return func

    def names(self) -> list[str]:
        """Every name this registry can run, including unambiguous bare legacy names."""
        merged = self._all()
        bare: dict[str, int] = {}
        for func in merged.values():
            bare[func.__name__] = bare.get(func.__name__, 0) + 1
        names = set(merged)
        names.update(name for name, count in bare.items() if count == 1)
        return sorted(names)

    def resolve(self, task_name: str) -> Callable[..., Any] | None:
        """The function for a stored task name, accepting unambiguous bare names."""
        func = self.get(task_name)
        if func is not None:
            return func
        matches = [f for f in self._all().values() if f.__name__ == task_name]
        return matches[0] if len(matches) == 1 else None

    def __contains__(self, task_name: str) -> bool:
        return self.resolve(task_name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


#: Process-wide registry: ``@pg_scheduler.task`` registers here, and every
#: Scheduler in the process can run what it holds.
default_registry = TaskRegistry()


@overload
def task(func: F, /) -> F: ...
@overload
def task(
    *,
    name: str | None = None,
    executor: str | None = None,
    dedupe_key: str | Callable[..., str] | None = None,
    dedupe_scope: str | None = None,
    max_running: int | None = None,
    rate_limit: str | RateLimit | None = None,
    queue: str | None = None,
    concurrency_key: str | Callable[..., str] | None = None,
    max_running_per_key: int | None = None,
    rate_limit_per_key: str | None = None,
    ordered: bool = False,
    debounce: timedelta | float | None = None,
    debounce_max_wait: timedelta | float | None = None,
    debounce_merge: Callable[[Any, Any], Any] | None = None,
    throttle: timedelta | float | None = None,
    batch_size: int | None = None,
    batch_timeout: timedelta | float | None = None,
    fair_share_key: str | Callable[..., str] | None = None,
    fair_share_weight: float | None = None,
) -> Callable[[F], F]: ...
def task(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    executor: str | None = None,
    dedupe_key: str | Callable[..., str] | None = None,
    dedupe_scope: str | None = None,
    max_running: int | None = None,
    rate_limit: str | RateLimit | None = None,
    queue: str | None = None,
    concurrency_key: str | Callable[..., str] | None = None,
    max_running_per_key: int | None = None,
    rate_limit_per_key: str | None = None,
    ordered: bool = False,
    debounce: timedelta | float | None = None,
    debounce_max_wait: timedelta | float | None = None,
    debounce_merge: Callable[[Any, Any], Any] | None = None,
    throttle: timedelta | float | None = None,
    batch_size: int | None = None,
    batch_timeout: timedelta | float | None = None,
    fair_share_key: str | Callable[..., str] | None = None,
    fair_share_weight: float | None = None,
) -> Any:
    """Register an async function as a task, usable before any Scheduler exists.

    ``@task`` names it ``module:qualname``; ``@task(name="emails.send")`` gives a
    stable name that survives moving the function to another module.
    ``@task(executor="thread")`` runs a plain ``def`` in the worker's thread
    pool, ``executor="process"`` in a spawned process of its own.
    ``dedupe_key``: every job of the task carries this key, or the key this
    function of the job's arguments returns (see docs/queues.md, Dedupe keys).
    ``max_running`` and ``rate_limit`` (``"100/m"``) are global limits across
    every worker, written to the database when a Scheduler starts (docs:
    Queues, limits and dedupe keys).
    ``@task(queue="emails")`` puts its jobs in queue ``emails`` (unless the
    call that schedules one names a queue; the default queue is ``"default"``).
    ``concurrency_key`` (a string, or a function of the job's arguments),
    ``max_running_per_key``, ``rate_limit_per_key`` and ``ordered``: per-key
    limits of its jobs (docs/keys.md); a call's own values override them.
    ``debounce``, ``debounce_max_wait``, ``throttle``: every job of the task is
    debounced or throttled on its dedupe key unless the call says otherwise;
    ``debounce_merge(previous, new)`` merges a burst's arguments
    (:class:`~pg_scheduler.CallArguments`; docs: Debounce and throttle).
    ``fair_share_key``: every job's fair share key (a tenant id), or the key
    this function of the job's arguments returns; ``fair_share_weight`` its
    jobs' weight (docs: Fair share between tenants).
    """
    return default_registry.decorator(func, TaskOptions.of(locals()))
