"""``chain``, ``group`` and ``chord``: graphs of jobs built on ``depends_on``.

Each returns a :class:`Flow`: a list of ``JobSpec`` in the order to hand to
``schedule_bulk`` (one call, one transaction), that also knows its ends:
``heads``, the specs a step placed before it must precede, and ``tails``,
the specs a step placed after it waits for. Flows nest::

    flow = chain(
        JobSpec(fetch, now, ("a.csv",)),
        group(JobSpec(parse, now, (1,)), JobSpec(parse, now, (2,))),
        JobSpec(report, now),
    )
    ids = await scheduler.schedule_bulk(flow)   # ids[i] is flow[i]'s

The specs given are the specs returned: each head of a later step gets the
tails of the step before it appended to its ``depends_on``; its other
dependencies, its policy (``on_dependency_failure``) and options stay its own.
A spec may appear once in a flow.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise
from typing import Any

from ..job_spec import JobSpec

__all__ = ["Flow", "chain", "chord", "group"]


class Flow(list[JobSpec]):
    """Specs for one ``schedule_bulk`` call, with the graph's ends."""

    def __init__(
        self, specs: Iterable[JobSpec], heads: list[JobSpec], tails: list[JobSpec]
    ) -> None:
        super().__init__(specs)
        seen: set[int] = set()
        for spec in self:
            if id(spec) in seen:
                raise ValueError(f"a JobSpec appears twice in one flow: {spec!r}")
            seen.add(id(spec))
        #: The specs a step placed before this flow must precede.
        self.heads = heads
        #: The specs a step placed after this flow waits for.
        self.tails = tails


Step = JobSpec | Flow | list[JobSpec] | tuple[JobSpec, ...]


def _flow(step: Any, where: str) -> Flow:
    if isinstance(step, Flow):
        return step
    if isinstance(step, JobSpec):
        return Flow([step], [step], [step])
    if isinstance(step, list | tuple):
        return group(*step)
    raise TypeError(f"{where} takes JobSpecs and flows (chain, group, chord), got {step!r}")


def _after(spec: JobSpec, dependencies: list[JobSpec]) -> None:
    """``spec`` also depends on ``dependencies`` (each once)."""
    current = list(spec.depends_on or ())
    known = {id(d) for d in current if isinstance(d, JobSpec)}
    current += [d for d in dependencies if id(d) not in known]
    spec.depends_on = current


def chain(*steps: Step) -> Flow:
    """Each step runs once the step before it has completed (all of its tails,
    for a group): ``chain(a, b, c)`` is a, then b, then c. A list or tuple
    among the steps is a group."""
    if not steps:
        raise ValueError("chain() needs at least one step")
    flows = [_flow(step, "chain()") for step in steps]
    for before, after in pairwise(flows):
        for head in after.heads:
            _after(head, before.tails)
    return Flow([spec for flow in flows for spec in flow], flows[0].heads, flows[-1].tails)


def group(*members: Step) -> Flow:
    """Members that run side by side, independent of each other; a step after
    the group waits for all of them."""
    if not members:
        raise ValueError("group() needs at least one member")
    flows = [_flow(member, "group()") for member in members]
    return Flow(
        [spec for flow in flows for spec in flow],
        [spec for flow in flows for spec in flow.heads],
        [spec for flow in flows for spec in flow.tails],
    )


def chord(header: Step, callback: Step) -> Flow:
    """``header`` (a group, or a list of steps) side by side, then ``callback``
    once all of them completed; the callback reads their results with
    ``current_job().dependency_results()``, in the header's order."""
    return chain(_flow(header, "chord()"), callback)
