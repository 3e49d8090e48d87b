"""Process-wide instrumentation hooks: job metrics and tracing plug in here.

The executor reads :data:`observers` once per job and ``schedule()`` reads
:data:`trace_injector` once per call; with nothing installed (the default)
that attribute read is all they pay. ``metrics.enable_job_metrics()`` and
``otel.enable_tracing()`` install themselves here; this module imports nothing
of the package, so anything may import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

#: What an attempt ended as, as observers see it.
OUTCOMES = (
    "completed",  # its completion was written
    "retried",  # it failed and will run again
    "failed",  # it failed for good
    "cancelled",  # cancel_job() stopped it
    "handed_back",  # shutdown handed it back unfinished
    "lost",  # its lease was lost: the outcome was not written, it runs again
    "interrupted",  # the worker itself was torn down around it
)


class JobObserver(Protocol):
    """Told when a claimed job's function starts and when its attempt ends.

    ``job_started`` runs in the job's own task (so a context variable set there
    is seen by the job's code). ``job_finished`` may run elsewhere: a completed
    job's outcome is known only once its completion is written, which the
    completer does after the job's task has ended. An observer that changed
    the task's context undoes that in the optional ``job_returned(handle)``,
    called in the job's task when its function has returned or raised. All of
    them must be quick and must not raise."""

    def job_started(self, row: Mapping[str, Any], task: str) -> Any: ...

    def job_finished(self, handle: Any, outcome: str, duration: float | None) -> None: ...


#: The installed observers (a tuple: the executor iterates it without a lock).
observers: tuple[JobObserver, ...] = ()
#: Given a job's task_data JSON text at schedule(), returns it with the
#: caller's trace context added (or unchanged). The second argument names a
#: root span to open (and end) when the caller has none: a workflow starts a
#: trace of its own. None: tracing is off.
trace_injector: Callable[[str, str | None], str] | None = None
#: ``span_opener(name, attributes, root_only)``: a context manager with a span
#: current inside it (a workflow's step, the enqueue of a graph). With
#: ``root_only``, a span is opened only when none is current. None: tracing
#: is off.
span_opener: Callable[[str, Mapping[str, Any], bool], AbstractContextManager[Any]] | None = None


def add_observer(observer: JobObserver) -> None:
    global observers
    if observer not in observers:
        observers = (*observers, observer)


def remove_observer(observer: JobObserver) -> None:
    global observers
    observers = tuple(o for o in observers if o is not observer)


def started(row: Mapping[str, Any], task: str) -> list[tuple[JobObserver, Any]]:
    """Tell every observer a job starts; the handles :func:`finished` needs."""
    return [(o, o.job_started(row, task)) for o in observers]


def returned(handles: list[tuple[JobObserver, Any]]) -> None:
    """In the job's task, once its function is over: observers' context undone."""
    for observer, handle in handles:
        hook = getattr(observer, "job_returned", None)
        if hook is not None:
            hook(handle)


def finished(handles: list[tuple[JobObserver, Any]], outcome: str, duration: float | None) -> None:
    for observer, handle in handles:
        observer.job_finished(handle, outcome, duration)
