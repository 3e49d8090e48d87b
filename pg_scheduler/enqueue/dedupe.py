"""Dedupe keys: checking them and working out a job's key.

A job may carry a ``dedupe_key``; at most one job per key and scope holds
it (the partial unique indexes of migrations 0008 and 0013). The key comes from the call
(``schedule(dedupe_key=...)``, ``JobSpec``, ``schedule_job``) or from the
task (``@task(dedupe_key=...)``: a string, or a function of the job's
arguments that returns one). The call's value wins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..support.validation import check_name

#: "active": held while the job is pending or running. "pending": held only
#: until the job first starts (a row claimed ahead into a worker's buffer has
#: not: it holds its key there, and after a hand-back), so one may wait while
#: another runs.
DEDUPE_SCOPES = ("active", "pending")
DEFAULT_DEDUPE_SCOPE = "active"

_KEY_ATTR = "__pg_scheduler_dedupe_key__"
_SCOPE_ATTR = "__pg_scheduler_dedupe_scope__"


def check_dedupe_key(value: Any, what: str = "dedupe_key") -> None:
    """None, or a non-empty str that PostgreSQL can store and index (<= 1024 bytes)."""
    if value is None:
        return
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str or None, got {type(value).__name__}: {value!r}")
    if not value:
        raise ValueError(f"{what} must be a non-empty string")
    check_name(what, value)


def check_dedupe_scope(value: Any) -> None:
    """None (the task's scope, else "active") or one of :data:`DEDUPE_SCOPES`."""
    if value is not None and value not in DEDUPE_SCOPES:
        raise ValueError(f"dedupe_scope must be one of {DEDUPE_SCOPES} or None, got {value!r}")


def mark_task(func: Any, dedupe_key: Any, dedupe_scope: Any) -> None:
    """Check and record ``@task(dedupe_key=..., dedupe_scope=...)`` on ``func``."""
    if dedupe_key is not None and not callable(dedupe_key):
        check_dedupe_key(dedupe_key, "@task dedupe_key")
    check_dedupe_scope(dedupe_scope)
    if dedupe_scope is not None and dedupe_key is None:
        raise ValueError("@task(dedupe_scope=...) needs a dedupe_key")
    if dedupe_key is not None:
        setattr(func, _KEY_ATTR, dedupe_key)
    if dedupe_scope is not None:
        setattr(func, _SCOPE_ATTR, dedupe_scope)


def has_task_key(func: Any) -> bool:
    """Whether ``func`` was registered with ``@task(dedupe_key=...)``."""
    return getattr(func, _KEY_ATTR, None) is not None


def resolve(
    func: Callable[..., Any] | None,
    dedupe_key: Any,
    dedupe_scope: Any,
    args: Any = (),
    kwargs: Any = None,
) -> tuple[str | None, str | None]:
    """The (key, scope) a job is written with: (None, None) for no key.

    ``func``'s task-level key applies when the call gives none; a key
    function is called with the job's arguments, and one that raises or
    returns something other than a str raises here (nothing is written).
    """
    check_dedupe_key(dedupe_key)
    check_dedupe_scope(dedupe_scope)
    key: Any = dedupe_key
    if key is None and func is not None:
        key = getattr(func, _KEY_ATTR, None)
        if callable(key):
            key = call_key_function(func, key, args, kwargs)
    if key is None:
        if dedupe_scope is not None:
            raise ValueError("dedupe_scope was given without a dedupe_key")
        return None, None
    scope = dedupe_scope or getattr(func, _SCOPE_ATTR, None) or DEFAULT_DEDUPE_SCOPE
    return key, scope


def call_key_function(
    func: Callable[..., Any] | None,
    key_function: Callable[..., Any],
    args: Any,
    kwargs: Any,
    option: str = "dedupe_key",
    check: Callable[[str, str], Any] | None = None,
    owner: str | None = None,
) -> str:
    """The key ``func``'s task's ``option`` function returns for a job's
    arguments: ValueError if it raises, TypeError if it returns no str, then
    ``check(key, what)`` (default: the dedupe key's check). ``owner``: whose
    function it is, if not the task's (``queue 'api'``)."""
    name = owner or f"task {getattr(func, '__qualname__', repr(func))}"
    try:
        key = key_function(*args, **(kwargs or {}))
    except Exception as exc:
        raise ValueError(
            f"the {option} function of {name} raised {type(exc).__name__}: {exc}; "
            "nothing was scheduled"
        ) from exc
    if not isinstance(key, str):
        raise TypeError(
            f"the {option} function of {name} must return a str, got {type(key).__name__}: {key!r}"
        )
    what = option.removesuffix("_key").replace("_", " ")
    (check or check_dedupe_key)(key, f"the {what} key of {name}")
    return key
