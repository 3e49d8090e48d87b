"""Operations on whole workflows: cancel a graph (from any of its jobs) or a
code-first workflow with its children; retry a graph from its failed job and
let it go on; retry a code-first workflow from its failed step; fork a
workflow from a step; read a graph; list workflows. Bad input writes nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import pytest

from pg_scheduler import JobNotFound, JobSpec, chain, group
from tests.support import workflow_ops_tasks as t
from tests.support.common import job_status, wait_for_status, wait_until


@pytest.fixture(autouse=True)
def fresh() -> None:
    t.reset()


def now() -> datetime:
    return datetime.now(UTC)


def spec(name: str, fn=t.node) -> JobSpec:
    return JobSpec(fn, now(), (name,))


async def statuses(pool: asyncpg.Pool, ids: list[str]) -> list[str | None]:
    return [await job_status(pool, i) for i in ids]


async def settled(pool: asyncpg.Pool, ids: list[str]) -> list[str | None]:
    """The statuses of ``ids`` once none is pending, running or waiting."""

    async def done() -> bool:
        return all(s not in ("pending", "running", "waiting") for s in await statuses(pool, ids))

    await wait_until(done, message=f"jobs {ids} to end")
    return await statuses(pool, ids)


async def count_rows(pool: asyncpg.Pool) -> tuple[int, int]:
    return (
        await pool.fetchval("SELECT count(*) FROM scheduled_jobs"),
        await pool.fetchval("SELECT count(*) FROM workflow_steps"),
    )


# -- cancel -------------------------------------------------------------------------


async def test_cancelling_any_job_of_a_graph_cancels_all_its_unfinished_jobs(pool, make_scheduler):
    scheduler = await make_scheduler()
    first, running = spec("first"), spec("running", t.held)
    flow = chain(first, running, group(spec("left"), spec("right")), spec("last"))
    unrelated = spec("unrelated", t.held)
    ids = await scheduler.schedule_bulk([*flow, unrelated])
    await wait_for_status(pool, ids[1], "running")
    # From a job in the middle: the graph is walked both ways.
    cancelled = await scheduler.cancel_workflow(ids[3])
    assert sorted(cancelled) == sorted(ids[1:5])
    assert await statuses(pool, ids[:5]) == ["completed"] + ["cancelled"] * 4
    assert await job_status(pool, ids[5]) == "running"  # not joined to the graph
    error = await pool.fetchval(
        "SELECT error_message FROM scheduled_jobs WHERE job_id = $1", ids[1]
    )
    assert error == f"cancelled with its workflow by cancel_workflow({ids[3]})"
    # The running job was stopped where it ran: its attempt is recorded cancelled.
    outcome = await pool.fetchval("SELECT outcome FROM job_attempts WHERE job_id = $1", ids[1])
    assert outcome == "cancelled"
    assert await scheduler.cancel_workflow(ids[0]) == []  # nothing left to cancel
    t.release.set()
    assert (await settled(pool, [ids[5]])) == ["completed"]
    assert t.runs["left"] == t.runs["right"] == t.runs["last"] == 0


async def test_cancelling_a_code_first_workflow_cancels_its_children(pool, make_scheduler):
    scheduler = await make_scheduler()
    parent = await scheduler.schedule(t.parent, args=(["a", "b", "c"],))

    async def children_running() -> bool:
        n = await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE parent_job_id = $1 AND status = 'running'",
            parent,
        )
        return n == 3

    await wait_until(children_running, message="the children to run")
    await scheduler.cancel_workflow(parent)
    children = await pool.fetch(
        "SELECT status FROM scheduled_jobs WHERE parent_job_id = $1", parent
    )
    assert await job_status(pool, parent) == "cancelled"
    assert [c["status"] for c in children] == ["cancelled"] * 3


async def test_cancel_workflow_of_an_unknown_job_or_a_bad_id(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    with pytest.raises(JobNotFound):
        await scheduler.cancel_workflow("no-such-job")
    with pytest.raises(TypeError, match="job id"):
        await scheduler.cancel_workflow(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        await scheduler.cancel_workflow("")


# -- retry ---------------------------------------------------------------------------


async def test_retrying_the_failed_job_of_a_graph_lets_the_graph_go_on(pool, make_scheduler):
    scheduler = await make_scheduler()
    t.failing.add("bad")
    flow = chain(spec("start"), spec("bad"), group(spec("x"), spec("y")), spec("end"))
    ids = await scheduler.schedule_bulk(flow)
    assert await settled(pool, ids) == ["completed", "failed"] + ["cancelled"] * 3
    t.failing.clear()
    reopened = await scheduler.retry_workflow(ids[1])
    assert reopened[0] == ids[1] and sorted(reopened[1:]) == sorted(ids[2:])
    assert await settled(pool, ids) == ["completed"] * 5
    assert t.runs == {"start": 1, "bad": 2, "x": 1, "y": 1, "end": 1}
    assert await scheduler.result(ids[4]) == "end"


async def test_a_dependent_another_failed_dependency_holds_waits_for_that_ones_retry(
    pool, make_scheduler
):
    scheduler = await make_scheduler()
    t.failing.update({"a", "b"})
    a, b = spec("a"), spec("b")
    join = JobSpec(t.node, now(), ("join",), depends_on=[a, b])
    ids = await scheduler.schedule_bulk([a, b, join])
    assert await settled(pool, ids) == ["failed", "failed", "cancelled"]
    t.failing.clear()
    assert await scheduler.retry_workflow(ids[0]) == [ids[0]]  # b still holds join
    assert await settled(pool, ids) == ["completed", "failed", "cancelled"]
    assert await scheduler.retry_workflow(ids[1]) == [ids[1], ids[2]]
    assert await settled(pool, ids) == ["completed"] * 3
    assert t.runs["join"] == 1


async def test_retry_workflow_refuses_what_it_cannot_retry_and_writes_nothing(pool, make_scheduler):
    scheduler = await make_scheduler()
    t.failing.add("bad")
    bad = spec("bad")
    after = JobSpec(t.node, now(), ("after",), depends_on=[bad], on_dependency_failure="wait")
    done = spec("done")
    ids = await scheduler.schedule_bulk([bad, after, done])
    await wait_for_status(pool, ids[0], "failed")
    await wait_for_status(pool, ids[2], "completed")
    before = await pool.fetch("SELECT job_id, status FROM scheduled_jobs ORDER BY job_id")
    with pytest.raises(ValueError, match="only a failed, cancelled or expired job"):
        await scheduler.retry_workflow(ids[2])
    with pytest.raises(ValueError, match="only a failed, cancelled or expired job"):
        await scheduler.retry_workflow(ids[1])  # waiting (policy wait)
    with pytest.raises(JobNotFound):
        await scheduler.retry_workflow("no-such-job")
    with pytest.raises(TypeError):
        await scheduler.retry_workflow(None)  # type: ignore[arg-type]
    assert await pool.fetch("SELECT job_id, status FROM scheduled_jobs ORDER BY job_id") == before
    # A cancelled dependent whose dependency failed: retry the dependency first.
    await scheduler.cancel_job(ids[1])
    with pytest.raises(ValueError, match=f"depends on {ids[0]}, which failed: retry that job"):
        await scheduler.retry_workflow(ids[1])
    # The wait policy: the failed job's retry is what the dependent waits for.
    t.failing.clear()
    assert await scheduler.retry_workflow(ids[0]) == [ids[0]]
    assert await settled(pool, ids[:1]) == ["completed"]
    assert await job_status(pool, ids[1]) == "cancelled"  # cancelled by hand: kept


async def test_retrying_a_failed_code_first_workflow_reruns_from_its_failed_step(
    pool, make_scheduler
):
    scheduler = await make_scheduler()
    t.failing.add("charge")
    job_id = await scheduler.schedule(t.staged, args=(1,))
    assert await settled(pool, [job_id]) == ["failed"]
    assert t.runs == {"reserve": 1, "charge": 1}
    t.failing.clear()
    assert await scheduler.retry_workflow(job_id) == [job_id]
    assert await scheduler.result(job_id, timeout=10) == 3
    # The completed step was replayed from its checkpoint, the failed one ran again.
    assert t.runs == {"reserve": 1, "charge": 2, "ship": 1}


# -- fork ----------------------------------------------------------------------------


@pytest.mark.parametrize("from_step", [2, "charge"])
async def test_a_fork_replays_the_steps_before_and_runs_the_rest(pool, make_scheduler, from_step):
    scheduler = await make_scheduler()
    original = await scheduler.schedule(t.staged, args=(1,))
    assert await scheduler.result(original, timeout=10) == 3
    assert t.runs == {"reserve": 1, "charge": 1, "ship": 1}
    fork = await scheduler.fork_workflow(original, from_step)
    assert fork != original
    assert await scheduler.result(fork, timeout=10) == 3
    assert t.runs == {"reserve": 1, "charge": 2, "ship": 2}
    steps = await pool.fetch(
        "SELECT seq, name FROM workflow_steps WHERE job_id = $1 ORDER BY seq", fork
    )
    assert [(s["seq"], s["name"]) for s in steps] == [(1, "reserve"), (2, "charge"), (3, "ship")]
    job = await scheduler.get_job(fork)
    assert job is not None and job.task_name == "wfops.staged" and job.args == [1]


async def test_a_fork_of_a_spawning_workflow_past_its_spawn_is_refused(pool, make_scheduler):
    scheduler = await make_scheduler()
    t.release.set()
    parent = await scheduler.schedule(t.parent, args=(["a"],))
    assert await scheduler.result(parent, timeout=10) == ["a"]
    before = await count_rows(pool)
    with pytest.raises(ValueError, match="not spawned children"):
        await scheduler.fork_workflow(parent, 3)
    assert await count_rows(pool) == before
    fork = await scheduler.fork_workflow(parent, 2)  # after "plan", before the spawn
    assert await scheduler.result(fork, timeout=10) == ["a"]


@pytest.mark.parametrize(
    "from_step, error, match",
    [
        (0, ValueError, "1 or more"),
        (-1, ValueError, "1 or more"),
        (True, TypeError, "step number or name"),
        (1.5, TypeError, "step number or name"),
        ("", ValueError, "empty name"),
        ("no-such-step", ValueError, "no step named"),
    ],
)
async def test_a_bad_fork_writes_nothing(pool, make_scheduler, from_step, error, match):
    scheduler = await make_scheduler()
    original = await scheduler.schedule(t.staged, args=(1,))
    await scheduler.result(original, timeout=10)
    before = await count_rows(pool)
    with pytest.raises(error, match=match):
        await scheduler.fork_workflow(original, from_step)
    assert await count_rows(pool) == before
    with pytest.raises(JobNotFound):
        await scheduler.fork_workflow("no-such-job", 1)


# -- reading ------------------------------------------------------------------------


async def test_a_graph_and_the_workflow_list(pool, make_scheduler):
    scheduler = await make_scheduler()
    flow = chain(spec("one"), group(spec("two"), spec("three")))
    ids = await scheduler.schedule_bulk(flow)
    workflow_id = await scheduler.schedule(t.staged, args=(5,))
    await settled(pool, [*ids, workflow_id])
    graph = await scheduler.workflow_graph(ids[2])
    assert [n["job_id"] for n in graph] == ids
    assert [n["depends_on"] for n in graph] == [[], [ids[0]], [ids[0]]]
    assert {n["status"] for n in graph} == {"completed"}
    listed = await scheduler.list_workflows()
    assert [(w["job_id"], w["kind"]) for w in listed] == [
        (workflow_id, "workflow"),
        (ids[0], "graph"),
    ]
    assert listed[0]["steps"] == 3
    assert await scheduler.list_workflows(status="failed") == []
    with pytest.raises(ValueError, match="unknown status"):
        await scheduler.list_workflows(status="broken")
    with pytest.raises(ValueError, match="limit"):
        await scheduler.list_workflows(limit=0)
    with pytest.raises(JobNotFound):
        await scheduler.workflow_graph("no-such-job")
