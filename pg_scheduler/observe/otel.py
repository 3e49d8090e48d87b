"""OpenTelemetry spans around each job run (extra ``otel``).

``enable_tracing()`` installs two hooks (see :mod:`pg_scheduler.observe.instrument`):

* at ``schedule()`` (and ``schedule_bulk``), when the caller has a current
  span, its context is stored in the job's ``task_data`` under
  :data:`TRACE_KEY` (W3C trace context, through the global propagator).
  Without a current span nothing is added;
* around each run, a span ``run <task>`` (kind CONSUMER) whose parent is that
  stored context, current while the job's function runs (so spans the job
  opens are its children), ended with the attempt's outcome.

Workflows and graphs make one trace each: a workflow scheduled without a
current span gets a root span ``schedule <task>`` of its own, so every run
of it (it runs again after each park) shares that trace; each step it runs
is a span ``step <name>`` under its run's span, and each child it spawns
carries the run's context (its run span is a child of the spawning run's).
A ``schedule_bulk`` call holding dependencies and made without a current
span runs under a span ``schedule graph``: every job of the graph is in it.

Only processes that called ``enable_tracing()`` do either; the rest pay one
attribute read per job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pg_scheduler.observe.instrument as instrument

from ..enums import DEFAULT_QUEUE
from ..support.install import install_hint

#: The reserved key of ``task_data`` that carries the scheduling trace context.
TRACE_KEY = "_pg_scheduler_trace"
_ERROR_OUTCOMES = frozenset({"failed", "retried", "lost"})


def _require_otel() -> Any:
    try:
        import opentelemetry.trace
    except ImportError:
        raise ImportError(f"tracing needs opentelemetry-api: {install_hint('otel')}") from None
    return opentelemetry.trace


class JobTracing:
    """The span-per-run observer and the trace-context injector."""

    def __init__(self, tracer_provider: Any = None) -> None:
        trace = _require_otel()
        from opentelemetry import context, propagate

        self._trace = trace
        self._context = context
        self._propagate = propagate
        self.tracer = trace.get_tracer("pg_scheduler", tracer_provider=tracer_provider)

    def inject(self, task_data: str, root: str | None = None) -> str:
        """``task_data`` with the current span's context added, if there is one;
        else, given ``root``, the context of a new span of that name (a trace
        of the job's own, for a workflow and everything it spawns)."""
        context = None
        if not self._trace.get_current_span().get_span_context().is_valid:
            if root is None:
                return task_data
            span = self.tracer.start_span(root, kind=self._trace.SpanKind.PRODUCER)
            span.end()
            context = self._trace.set_span_in_context(span)
        carrier: dict[str, str] = {}
        self._propagate.inject(carrier, context=context)
        if not carrier or not task_data.endswith("}"):
            return task_data
        return f'{task_data[:-1]}, "{TRACE_KEY}": {json.dumps(carrier)}}}'

    def span(
        self, name: str, attributes: Mapping[str, Any], root_only: bool
    ) -> AbstractContextManager[Any]:
        """A span current inside the block (ended with it; an exception that
        leaves the block is recorded on it). With ``root_only``, none is opened
        while a span is current."""
        if root_only and self._trace.get_current_span().get_span_context().is_valid:
            return nullcontext()
        return self.tracer.start_as_current_span(
            name, kind=self._trace.SpanKind.INTERNAL, attributes=dict(attributes)
        )

    def _parent(self, row: Any) -> Any:
        raw = row.get("task_data")
        if not isinstance(raw, str) or TRACE_KEY not in raw:
            return None
        try:
            carrier = json.loads(raw).get(TRACE_KEY)
        except ValueError:
            return None
        return self._propagate.extract(carrier) if isinstance(carrier, dict) else None

    def job_started(self, row: Any, task: str) -> list[Any]:
        span = self.tracer.start_span(
            f"run {task}",
            context=self._parent(row),
            kind=self._trace.SpanKind.CONSUMER,
            attributes={
                "pg_scheduler.job_id": str(row.get("job_id")),
                "pg_scheduler.task": task,
                "pg_scheduler.queue": row.get("queue") or DEFAULT_QUEUE,
                "pg_scheduler.attempt": int(row.get("attempts") or 1),
            },
        )
        token = self._context.attach(self._trace.set_span_in_context(span))
        return [span, token]

    def job_returned(self, handle: list[Any]) -> None:
        """In the job's task: the span stops being current (it ends later,
        with the outcome, possibly in the completer's task)."""
        token, handle[1] = handle[1], None
        if token is not None:
            self._context.detach(token)

    def job_finished(self, handle: list[Any], outcome: str, duration: float | None) -> None:
        span = handle[0]
        span.set_attribute("pg_scheduler.outcome", outcome)
        if outcome in _ERROR_OUTCOMES:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, outcome))
        span.end()
        self.job_returned(handle)


_installed: JobTracing | None = None


def enable_tracing(tracer_provider: Any = None) -> JobTracing:
    """Trace every job this process runs, and carry callers' trace context
    from ``schedule()`` into their jobs. ``tracer_provider``: default, the
    global one. Calling it again replaces the previous setup."""
    global _installed
    tracing = JobTracing(tracer_provider)
    disable_tracing()
    instrument.add_observer(tracing)
    instrument.trace_injector = tracing.inject
    instrument.span_opener = tracing.span
    _installed = tracing
    return tracing


def disable_tracing() -> None:
    """Stop tracing runs and carrying context (jobs already stored keep theirs)."""
    global _installed
    if _installed is not None:
        instrument.remove_observer(_installed)
        if instrument.trace_injector == _installed.inject:
            instrument.trace_injector = None
        if instrument.span_opener == _installed.span:
            instrument.span_opener = None
        _installed = None


__all__ = ["TRACE_KEY", "JobTracing", "disable_tracing", "enable_tracing"]
