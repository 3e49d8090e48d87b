"""Concurrency keys: a job's key and its per-key limits, checked and resolved.

A job may carry a ``concurrency_key`` (from the call, or from its task:
``@task(concurrency_key=...)``, a string or a function of the job's
arguments) and per-key limits: ``max_running_per_key`` (at most N of the
key's jobs run at once anywhere), ``rate_limit_per_key`` (at most N starts
in any window, written as the global limits are: ``"10/s"``, see
:mod:`pg_scheduler.limits`) and ``ordered`` (the key's jobs run one at a
time in enqueue order). A value the call gives overrides the task's. The
database enforces them in the keyed claim (:mod:`pg_scheduler.store.keys`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..limits import parse_rate_limit
from ..support.validation import check_name
from .dedupe import call_key_function

_ATTR = "__pg_scheduler_concurrency__"
_NAMES = ("concurrency_key", "max_running_per_key", "rate_limit_per_key", "ordered")
#: The most jobs of one key that may run at once.
MAX_PER_KEY = 1_000_000


class KeyFields(NamedTuple):
    """A job's key columns (migration 0017), as the row stores them."""

    concurrency_key: str | None = None
    max_running_per_key: int | None = None
    rate_count_per_key: int | None = None
    rate_period_per_key: float | None = None
    key_ordered: bool = False


NO_KEY = KeyFields()


def check_concurrency_key(value: Any, what: str = "concurrency_key") -> None:
    """None, or a non-empty str PostgreSQL can store and index."""
    if value is None:
        return
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str or None, got {type(value).__name__}: {value!r}")
    if not value:
        raise ValueError(f"{what} must be a non-empty string")
    check_name(what, value)


def check_max_running_per_key(value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_running_per_key must be a positive int or None, got {value!r}")
    if not 1 <= value <= MAX_PER_KEY:
        raise ValueError(f"max_running_per_key must be 1..{MAX_PER_KEY}, got {value}")


def check_rate_limit_per_key(value: Any) -> None:
    try:
        parse_rate_limit(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(str(exc).replace("rate_limit", "rate_limit_per_key", 1)) from None


def check_ordered(value: Any, max_running: Any = None) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"ordered must be True or False, got {value!r}")
    if value and max_running is not None and max_running != 1:
        raise ValueError(
            f"ordered=True runs a key's jobs one at a time: max_running_per_key must be "
            f"1 or None with it, got {max_running!r}"
        )


def check_key_options(options: Any) -> None:
    """The per-key options of a call (a JobOptions or JobSpec); a callable key
    is the task's only."""
    check_concurrency_key(options.concurrency_key)
    check_max_running_per_key(options.max_running_per_key)
    check_rate_limit_per_key(options.rate_limit_per_key)
    check_ordered(options.ordered, options.max_running_per_key)


def check_task_keys(options: Any) -> None:
    """``@task(concurrency_key=..., ...)``'s per-key options (``options``: the TaskOptions)."""
    key = options.concurrency_key
    if key is not None and not callable(key):
        check_concurrency_key(key, "@task concurrency_key")
    check_max_running_per_key(options.max_running_per_key)
    check_rate_limit_per_key(options.rate_limit_per_key)
    check_ordered(options.ordered, options.max_running_per_key)


def mark_task(func: Any, options: Any) -> None:
    """Check and record ``@task(concurrency_key=..., ...)`` (``options``: the
    TaskOptions) on ``func``."""
    check_task_keys(options)
    key = options.concurrency_key
    values = (key, options.max_running_per_key, options.rate_limit_per_key, options.ordered)
    if values != (None, None, None, False):
        setattr(func, _ATTR, values)


def has_task_keys(func: Any) -> bool:
    """Whether ``func`` was registered with any per-key option."""
    return getattr(func, _ATTR, None) is not None


def wants_keys(options: Any, func: Any) -> bool:
    """Whether a job of ``func`` with ``options`` (JobOptions or JobSpec) may carry a key."""
    return (
        options.concurrency_key is not None
        or options.max_running_per_key is not None
        or options.rate_limit_per_key is not None
        or options.ordered is not False
        or has_task_keys(func)
    )


def resolve(
    func: Any,
    options: Any,
    args: Any = (),
    kwargs: Any = None,
    queue: Any = None,
    fair_given: bool = False,
) -> KeyFields:
    """The key columns of one job: the call's values (``options``: a
    JobOptions or JobSpec) over its task's (``func``: None for a job scheduled
    by name) over its queue's (``queue``: a QueueKeys, or None). The queue's
    key applies only to a job given no fair share key (``fair_given``); its
    limits, to a job with a concurrency key. TypeError/ValueError on a bad
    one, a key function that raises or returns no string, or limits the call
    or task gives without a key."""
    check_key_options(options)
    key, most = options.concurrency_key, options.max_running_per_key
    rate, ordered = options.rate_limit_per_key, options.ordered
    task = getattr(func, _ATTR, None) if func is not None else None
    if task is not None:
        t_key, t_most, t_rate, t_ordered = task
        if key is None and t_key is not None:
            key = (
                call_key_function(
                    func, t_key, args, kwargs, "concurrency_key", check_concurrency_key
                )
                if callable(t_key)
                else t_key
            )
        most = t_most if most is None else most
        rate = t_rate if rate is None else rate
        ordered = ordered or t_ordered
    if queue is not None:
        q_key = queue.concurrency_key
        if key is None and q_key is not None and not fair_given:
            key = (
                call_key_function(
                    func,
                    q_key,
                    args,
                    kwargs,
                    "concurrency_key",
                    check_concurrency_key,
                    owner=f"queue {queue.queue!r}",
                )
                if callable(q_key)
                else q_key
            )
        if key is not None:
            ordered = ordered or (queue.ordered and most in (None, 1))
            most = queue.max_running_per_key if most is None and not ordered else most
            rate = queue.rate_limit_per_key if rate is None else rate
    if key is None:
        limits = (most, rate, ordered)
        given = [n for n, v in zip(_NAMES[1:], limits, strict=True) if v not in (None, False)]
        if given:
            raise ValueError(f"{', '.join(given)} needs a concurrency_key")
        return NO_KEY
    check_ordered(ordered, most)
    parsed = parse_rate_limit(rate)
    return KeyFields(
        key,
        1 if ordered else most,
        None if parsed is None else parsed.count,
        None if parsed is None else parsed.period,
        bool(ordered),
    )
