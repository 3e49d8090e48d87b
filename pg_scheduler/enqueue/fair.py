"""Fair share keys and weights: checking them and working out a job's.

A job may carry a ``fair_share_key`` (a tenant id, usually) and a
``fair_share_weight`` (a positive number; None: 1). Workers share the starts
of due work of equal priority between keys in proportion to their weights
(store/fair_sql.py, docs/fair-share.md). The key and weight come from the
call (``schedule(fair_share_key=...)``, ``JobSpec``) or from the task
(``@task(fair_share_key=...)``: a string, or a function of the job's
arguments that returns one). The call's value wins; a weight set per key
with ``Scheduler.set_fair_share_weight`` wins over both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real
from typing import Any

from ..support.validation import check_name
from .dedupe import call_key_function

_KEY_ATTR = "__pg_scheduler_fair_share_key__"
_WEIGHT_ATTR = "__pg_scheduler_fair_share_weight__"


def check_fair_share_key(value: Any, what: str = "fair_share_key") -> None:
    """None, or a non-empty str that PostgreSQL can store and index."""
    if value is None:
        return
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str or None, got {type(value).__name__}: {value!r}")
    if not value:
        raise ValueError(f"{what} must be a non-empty string")
    check_name(what, value)


def check_fair_share_weight(value: Any, what: str = "fair_share_weight") -> None:
    """None, or a finite number greater than 0 (not a bool)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{what} must be a number or None, got {type(value).__name__}: {value!r}")
    number = float(value)
    if math.isnan(number) or math.isinf(number) or number <= 0:
        raise ValueError(f"{what} must be a finite number greater than 0, got {value!r}")


def mark_task(func: Any, fair_share_key: Any, fair_share_weight: Any) -> None:
    """Check and record ``@task(fair_share_key=..., fair_share_weight=...)`` on ``func``."""
    if fair_share_key is not None and not callable(fair_share_key):
        check_fair_share_key(fair_share_key, "@task fair_share_key")
    check_fair_share_weight(fair_share_weight, "@task fair_share_weight")
    if fair_share_weight is not None and fair_share_key is None:
        raise ValueError("@task(fair_share_weight=...) needs a fair_share_key")
    if fair_share_key is not None:
        setattr(func, _KEY_ATTR, fair_share_key)
    if fair_share_weight is not None:
        setattr(func, _WEIGHT_ATTR, float(fair_share_weight))


def resolve(
    func: Callable[..., Any] | None,
    fair_share_key: Any,
    fair_share_weight: Any,
    args: Any = (),
    kwargs: Any = None,
    queue: Any = None,
    keyed: bool = False,
) -> tuple[str | None, float | None]:
    """The (key, weight) a job is written with: (None, None) for no key.

    ``func``'s task-level key and weight apply where the call gives none,
    then its queue's (``queue``: a QueueKeys, or None; its key only for a job
    without a concurrency key, ``keyed``); a key function is called with the
    job's arguments, and one that raises or returns something other than a
    str raises here (nothing is written)."""
    check_fair_share_key(fair_share_key)
    check_fair_share_weight(fair_share_weight)
    key: Any = fair_share_key
    if key is None and func is not None:
        key = getattr(func, _KEY_ATTR, None)
        if callable(key):
            key = call_key_function(func, key, args, kwargs, "fair_share_key", check_fair_share_key)
    from_queue = False
    if key is None and queue is not None and queue.fair_share_key is not None and not keyed:
        key, from_queue = queue.fair_share_key, True
        if callable(key):
            key = call_key_function(
                func,
                key,
                args,
                kwargs,
                "fair_share_key",
                check_fair_share_key,
                owner=f"queue {queue.queue!r}",
            )
    if key is None:
        if fair_share_weight is not None:
            raise ValueError("fair_share_weight was given without a fair_share_key")
        return None, None
    weight = fair_share_weight
    if weight is None and func is not None and not from_queue:
        weight = getattr(func, _WEIGHT_ATTR, None)
    if weight is None and queue is not None:
        weight = queue.fair_share_weight
    return key, None if weight is None else float(weight)


def has_task_key(func: Any) -> bool:
    """Whether ``func`` was registered with ``@task(fair_share_key=...)``."""
    return getattr(func, _KEY_ATTR, None) is not None


def check_one_key(concurrency_key: str | None, fair_share_key: str | None) -> None:
    """A job carries a concurrency key or a fair share key, not both: the
    keyed claim and the fair claim each take their own rows (docs/fair-share.md)."""
    if concurrency_key is not None and fair_share_key is not None:
        raise ValueError(
            f"a job takes concurrency_key ({concurrency_key!r}) or fair_share_key "
            f"({fair_share_key!r}), not both"
        )
