"""Debounce and throttle: their checks, a task's defaults, and the merge of a
burst's arguments (docs/debounce-throttle.md).

``schedule(..., debounce=..., dedupe_key=...)``: the calls of a burst with one
key make one job, due ``debounce`` after the burst's last call (never later
than ``debounce_max_wait`` after its first), with the last call's arguments or
those the task's ``debounce_merge`` makes of them. ``throttle=``: the first
call of each period per key writes a job; the others in that period write
nothing and return that job's id. The writes are in ``timed.py``.

Everything here is checked at the call, before anything is written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

from ..support.timeutil import human_seconds
from ..support.validation import clip_repr

#: The dedupe scopes of debounced and throttled rows (their job records show them).
DEBOUNCE_SCOPE = "debounce"
THROTTLE_SCOPE = "throttle"

_TASK_ATTR = "__pg_scheduler_timing__"


class CallArguments(NamedTuple):
    """A call's positional and keyword arguments, as ``debounce_merge`` sees
    and returns them: ``merge(previous, new) -> CallArguments``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Timing:
    """How one call is debounced or throttled (seconds)."""

    kind: str  # DEBOUNCE_SCOPE or THROTTLE_SCOPE
    seconds: float
    max_wait: float | None = None
    merge: Callable[[CallArguments, CallArguments], Any] | None = None


@dataclass(frozen=True, slots=True)
class _TaskTiming:
    debounce: Any
    max_wait: Any
    merge: Any
    throttle: Any


def check_duration(name: str, value: Any) -> None:
    """None, or a positive finite timedelta or number of seconds."""
    if value is None:
        return
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(
            f"{name} must be a timedelta or a number of seconds, got {clip_repr(value)}"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{name} must be a finite duration > 0, got {human_seconds(seconds)}")


def _seconds(value: Any) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _check_combination(debounce: Any, max_wait: Any, throttle: Any, where: str) -> None:
    if debounce is not None and throttle is not None:
        raise ValueError(f"{where}give debounce or throttle, not both")
    if max_wait is not None and debounce is None:
        raise ValueError(f"{where}debounce_max_wait needs debounce")
    if max_wait is not None and _seconds(max_wait) < _seconds(debounce):
        raise ValueError(
            f"{where}debounce_max_wait ({human_seconds(_seconds(max_wait))}) must not be "
            f"shorter than debounce ({human_seconds(_seconds(debounce))})"
        )


def mark_task(func: Any, debounce: Any, max_wait: Any, merge: Any, throttle: Any) -> None:
    """Check and record ``@task(debounce=..., debounce_max_wait=...,
    debounce_merge=..., throttle=...)`` on ``func``: its jobs' defaults."""
    check_duration("@task debounce", debounce)
    check_duration("@task debounce_max_wait", max_wait)
    check_duration("@task throttle", throttle)
    if merge is not None and not callable(merge):
        raise TypeError(f"@task debounce_merge must be callable, got {clip_repr(merge)}")
    if merge is not None and throttle is not None:
        raise ValueError("@task debounce_merge applies to debounce, not to throttle")
    _check_combination(debounce, max_wait, throttle, "@task: ")
    if any(v is not None for v in (debounce, max_wait, merge, throttle)):
        setattr(func, _TASK_ATTR, _TaskTiming(debounce, max_wait, merge, throttle))


def has_task_timing(func: Any) -> bool:
    """Whether ``func``'s task debounces or throttles its jobs by default."""
    marks = getattr(func, _TASK_ATTR, None)
    return marks is not None and (marks.debounce is not None or marks.throttle is not None)


def timing_of(func: Any, options: Any) -> Timing | None:
    """How a call of ``func`` with ``options`` (a JobOptions, values checked)
    is debounced or throttled, the task's defaults applied; None: neither.
    The call's ``debounce`` or ``throttle`` replaces the task's (both of
    them); its ``debounce_max_wait`` replaces the task's."""
    marks: _TaskTiming | None = getattr(func, _TASK_ATTR, None)
    debounce, throttle = options.debounce, options.throttle
    max_wait = options.debounce_max_wait
    if marks is not None:
        if debounce is None and throttle is None:
            debounce, throttle = marks.debounce, marks.throttle
        if max_wait is None and debounce is not None:
            max_wait = marks.max_wait
    if debounce is None and throttle is None:
        if max_wait is not None:
            raise ValueError("debounce_max_wait needs debounce")
        return None
    _check_combination(debounce, max_wait, throttle, "")
    if throttle is not None:
        return Timing(THROTTLE_SCOPE, _seconds(throttle))
    merge = None if marks is None else marks.merge
    wait = None if max_wait is None else _seconds(max_wait)
    return Timing(DEBOUNCE_SCOPE, _seconds(debounce), wait, merge)


def check_timed_call(timing: Timing, key: str | None, execution_time: Any, options: Any) -> None:
    """What a debounced or throttled call may not combine with; ValueError."""
    what = timing.kind
    if key is None:
        raise ValueError(f"{what} needs a dedupe_key (the call's or the task's): the burst's key")
    if options.dedupe_scope is not None:
        raise ValueError(f"{what} sets the job's dedupe scope itself: give no dedupe_scope")
    if options.job_id is not None:
        raise ValueError(f"{what} writes a job of its own id (the key names it): give no job_id")
    if options.depends_on:
        raise ValueError(f"{what} cannot be combined with depends_on")
    if what == DEBOUNCE_SCOPE and (execution_time is not None or options.delay is not None):
        raise ValueError(
            "debounce decides the job's due time (the burst's last call plus debounce): "
            "give no execution_time or delay"
        )
