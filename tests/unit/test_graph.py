"""chain, group and chord: the depends_on they fill in, and what they refuse."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pg_scheduler import Flow, JobSpec, chain, chord, group

WHEN = datetime(2031, 1, 2, tzinfo=UTC)


async def work(n: int = 0) -> int:
    return n


def spec(n: int) -> JobSpec:
    return JobSpec(work, WHEN, (n,))


def deps(s: JobSpec) -> list[JobSpec]:
    return list(s.depends_on or ())


def test_chain_makes_each_spec_wait_for_the_one_before() -> None:
    a, b, c = spec(1), spec(2), spec(3)
    flow = chain(a, b, c)
    assert isinstance(flow, Flow) and list(flow) == [a, b, c]
    assert [deps(s) for s in flow] == [[], [a], [b]]
    assert flow.heads == [a] and flow.tails == [c]


def test_a_group_in_a_chain_fans_out_and_joins() -> None:
    a, b1, b2, c = spec(1), spec(2), spec(3), spec(4)
    flow = chain(a, group(b1, b2), c)
    assert list(flow) == [a, b1, b2, c]
    assert deps(b1) == [a] and deps(b2) == [a]
    assert deps(c) == [b1, b2]


def test_a_list_is_a_group_and_groups_nest_chains() -> None:
    a, b, c, d = spec(1), spec(2), spec(3), spec(4)
    flow = chain([chain(a, b), c], d)
    assert deps(b) == [a] and deps(c) == [] and deps(d) == [b, c]
    assert flow.heads == [a, c] and flow.tails == [d]


def test_chord_runs_the_callback_after_the_whole_header() -> None:
    parts = [spec(i) for i in range(3)]
    callback = spec(9)
    flow = chord(parts, callback)
    assert list(flow) == [*parts, callback]
    assert deps(callback) == parts
    assert flow.heads == parts and flow.tails == [callback]


def test_existing_dependencies_and_options_are_kept() -> None:
    a = spec(1)
    b = JobSpec(work, WHEN, (2,), depends_on=["an-existing-job"], on_dependency_failure="run")
    chain(a, b)
    assert b.depends_on == ["an-existing-job", a]
    assert b.on_dependency_failure == "run"
    chain(a, b)  # built again: a is not added twice
    assert b.depends_on == ["an-existing-job", a]


def test_a_spec_may_appear_once_in_a_flow() -> None:
    a = spec(1)
    with pytest.raises(ValueError, match="twice"):
        chain(a, spec(2), a)


@pytest.mark.parametrize("call", [chain, group])
def test_empty_and_foreign_steps_are_refused(call) -> None:
    with pytest.raises(ValueError, match="at least one"):
        call()
    with pytest.raises(TypeError, match="JobSpecs and flows"):
        call(spec(1), "not a spec")


def test_a_long_chain_prints_and_compares_without_recursing() -> None:
    flow = chain(*(spec(i) for i in range(5_000)))
    assert "depends_on=[<JobSpec work>]" in repr(flow[-1])
    assert flow[-1] == flow[-1]
