"""A queue's key defaults: ``queue_keys("api", concurrency_key=..., ...)``.

A queue may declare the keys and per-key limits its jobs take when neither
the call nor the task gives them: a concurrency key (a string, or a function
of the job's arguments) with ``max_running_per_key``, ``rate_limit_per_key``
and ``ordered``, or a fair share key with its weight. Like ``@task``'s, the
declaration lives in the code (every process that schedules into the queue
imports it) and is applied when a job is written, so the claim reads only
the row. Precedence, field by field: the call, then the task, then the
queue. A queue's limits alone (no key) bind the queue's jobs that carry a
concurrency key from their call or task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..support.validation import check_queue
from .fair import check_fair_share_key, check_fair_share_weight, check_one_key, has_task_key
from .fair import resolve as resolve_fair
from .keys import (
    KeyFields,
    check_concurrency_key,
    check_max_running_per_key,
    check_ordered,
    check_rate_limit_per_key,
)


class QueueKeys(NamedTuple):
    """One queue's declared defaults (see :func:`queue_keys`)."""

    queue: str
    concurrency_key: str | Callable[..., str] | None = None
    max_running_per_key: int | None = None
    rate_limit_per_key: str | None = None
    ordered: bool = False
    fair_share_key: str | Callable[..., str] | None = None
    fair_share_weight: float | None = None


#: Queue name -> its defaults; empty unless a queue declared some.
DECLARED: dict[str, QueueKeys] = {}


def queue_keys(
    queue: str,
    *,
    concurrency_key: str | Callable[..., str] | None = None,
    max_running_per_key: int | None = None,
    rate_limit_per_key: str | None = None,
    ordered: bool = False,
    fair_share_key: str | Callable[..., str] | None = None,
    fair_share_weight: float | None = None,
) -> None:
    """Declare the key defaults of ``queue``'s jobs, in this process (do it
    where the tasks are declared, so producers and workers share it). A key
    may be a function of the job's arguments, called as
    ``key(*args, **kwargs)``. Called again, it replaces the queue's defaults;
    with no option, it removes them. TypeError/ValueError on a bad value
    (nothing is changed)."""
    check_queue(queue)
    if concurrency_key is not None and not callable(concurrency_key):
        check_concurrency_key(concurrency_key, "queue_keys concurrency_key")
    check_max_running_per_key(max_running_per_key)
    check_rate_limit_per_key(rate_limit_per_key)
    check_ordered(ordered, max_running_per_key)
    if fair_share_key is not None and not callable(fair_share_key):
        check_fair_share_key(fair_share_key, "queue_keys fair_share_key")
    check_fair_share_weight(fair_share_weight, "queue_keys fair_share_weight")
    if concurrency_key is not None and fair_share_key is not None:
        raise ValueError(
            "queue_keys takes concurrency_key or fair_share_key, not both: a job "
            "carries one kind of key"
        )
    if fair_share_weight is not None and fair_share_key is None:
        raise ValueError("queue_keys(fair_share_weight=...) needs a fair_share_key")
    declared = QueueKeys(
        queue,
        concurrency_key,
        max_running_per_key,
        rate_limit_per_key,
        ordered,
        fair_share_key,
        None if fair_share_weight is None else float(fair_share_weight),
    )
    if declared == QueueKeys(queue):
        DECLARED.pop(queue, None)
    else:
        DECLARED[queue] = declared


def of(queue: str | None) -> QueueKeys | None:
    """The defaults ``queue`` declared, if any."""
    if not DECLARED or queue is None:
        return None
    return DECLARED.get(queue)


def fair_given(defaults: QueueKeys | None, options: Any, func: Any) -> bool:
    """Whether the call (``options``) or the task (``func``) gives a job of a
    queue with ``defaults`` a fair share key: the queue's concurrency key does
    not apply to it then."""
    if defaults is None:
        return False
    return options.fair_share_key is not None or (func is not None and has_task_key(func))


def fair_of(
    func: Any, options: Any, args: Any, kwargs: Any, defaults: QueueKeys | None, keys: KeyFields
) -> tuple[str | None, float | None]:
    """A job's fair share (key, weight): the call's (``options``), else its
    task's, else its queue's (``defaults``) when ``keys`` (its resolved
    concurrency key) has none; ValueError if it ends with both kinds."""
    fair = resolve_fair(
        func,
        options.fair_share_key,
        options.fair_share_weight,
        args,
        kwargs,
        defaults,
        keys.concurrency_key is not None,
    )
    check_one_key(keys.concurrency_key, fair[0])
    return fair


def declared_queues() -> dict[str, QueueKeys]:
    """Every declaration, by queue (a copy)."""
    return dict(DECLARED)
