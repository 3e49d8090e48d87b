"""A call's arguments held to its function's signature before anything is written.

``schedule(send, args=("a", "b", "c"))`` for ``async def send(to)`` would
otherwise be written, claimed and fail on a worker with the TypeError the
caller should have had. Binding depends only on how many positional
arguments there are and which keywords are named, never on their values, so
each (function, shape) is bound once and remembered: a bulk of a million rows
with one shape costs one bind and a dictionary lookup per row.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..batching import batch_options_of
from ..tasks import task_name_of
from ..workflows.decorator import is_workflow

# (function, number of positional arguments, keyword names) that bind.
_FITS: dict[tuple[Any, int, tuple[str, ...]], bool] = {}
# Forgotten when it grows past this (shapes are few; functions may be many).
_MAX_REMEMBERED = 10_000


def check_arguments(func: Callable[..., Any], args: Any, kwargs: Any) -> None:
    """TypeError, naming the task and its signature, unless ``func(*args,
    **kwargs)`` binds (a workflow's context first). Functions without a
    signature Python can read pass."""
    shape = (func, len(args), tuple(kwargs) if kwargs else ())
    if shape in _FITS:
        return
    if batch_options_of(func) is not None:
        # A batch task's function takes the batch: a job's arguments are
        # its item's, whatever their shape (docs/batches.md).
        return
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return
    lead = (None,) if is_workflow(func) else ()
    try:
        signature.bind(*lead, *args, **(kwargs or {}))
    except TypeError as exc:
        empty = inspect.Parameter.empty
        parameters = list(signature.parameters.values())[len(lead) :]
        shown = signature.replace(
            parameters=[p.replace(annotation=empty) for p in parameters],
            return_annotation=empty,
        )
        raise TypeError(
            f"{task_name_of(func)}{shown} cannot take these arguments ({exc}); "
            "nothing was scheduled"
        ) from None
    if len(_FITS) >= _MAX_REMEMBERED:
        _FITS.clear()
    _FITS[shape] = True
