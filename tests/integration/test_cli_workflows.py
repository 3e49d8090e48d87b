"""``pg-scheduler workflows``: list, graph, cancel (a running job is stopped on
its worker through the cancel channel), retry and fork, with exit codes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pg_scheduler import JobSpec, chain
from tests.integration.test_cli_ops import _keep_test_logging, cli  # noqa: F401
from tests.support import workflow_ops_tasks as t
from tests.support.common import job_status, wait_for_status, wait_until


@pytest.fixture(autouse=True)
def fresh() -> None:
    t.reset()


def spec(name: str, fn=t.node) -> JobSpec:
    return JobSpec(fn, datetime.now(UTC), (name,))


async def test_cancel_a_graph_from_the_command_line(pool, dsn, make_scheduler):
    scheduler = await make_scheduler()
    ids = await scheduler.schedule_bulk(chain(spec("held", t.held), spec("after")))
    await wait_for_status(pool, ids[0], "running")
    refused = await cli(dsn, "workflows", "cancel", ids[1])
    assert refused.code == 2 and "refusing without confirmation" in refused.err
    result = await cli(dsn, "workflows", "cancel", ids[1], "--yes", "--json")
    assert result.code == 0 and sorted(result.json()["cancelled"]) == sorted(ids)
    # The running job heard it on its worker: its coroutine is gone.
    await wait_until(lambda: not scheduler.worker.running, message="the job to stop")
    assert [await job_status(pool, i) for i in ids] == ["cancelled", "cancelled"]
    unknown = await cli(dsn, "workflows", "cancel", "no-such-job", "--yes")
    assert unknown.code == 1 and "no job with id 'no-such-job'" in unknown.err


async def test_retry_graph_list_and_fork_from_the_command_line(pool, dsn, make_scheduler):
    scheduler = await make_scheduler()
    t.failing.add("bad")
    ids = await scheduler.schedule_bulk(chain(spec("bad"), spec("next")))
    await wait_for_status(pool, ids[1], "cancelled")
    graph = await cli(dsn, "workflows", "graph", ids[1], "--json")
    assert graph.code == 0
    nodes = graph.json()["nodes"]
    assert [(n["job_id"], n["status"], n["depends_on"]) for n in nodes] == [
        (ids[0], "failed", []),
        (ids[1], "cancelled", [ids[0]]),
    ]
    shown = await cli(dsn, "workflows", "graph", ids[0])
    assert shown.code == 0 and "2 job(s), 1 cancelled, 1 failed" in shown.out
    not_failed = await cli(dsn, "workflows", "retry", ids[1])
    assert not_failed.code == 1 and f"depends on {ids[0]}, which failed" in not_failed.err
    t.failing.clear()
    retried = await cli(dsn, "workflows", "retry", ids[0], "--json")
    assert retried.code == 0 and retried.json() == {"retried": ids}
    await wait_for_status(pool, ids[1], "completed")

    workflow_id = await scheduler.schedule(t.staged, args=(1,))
    assert await scheduler.result(workflow_id, timeout=10) == 3
    listed = await cli(dsn, "workflows", "list", "--json")
    assert [(w["job_id"], w["kind"]) for w in listed.json()["workflows"]] == [
        (workflow_id, "workflow"),
        (ids[0], "graph"),
    ]
    table = await cli(dsn, "workflows", "list", "--status", "completed")
    assert table.code == 0 and workflow_id in table.out
    forked = await cli(dsn, "workflows", "fork", workflow_id, "--from-step", "ship", "--json")
    assert forked.code == 0
    new_id = forked.json()["job_id"]
    assert await scheduler.result(new_id, timeout=10) == 3
    assert (t.runs["reserve"], t.runs["charge"], t.runs["ship"]) == (1, 1, 2)
    bad_step = await cli(dsn, "workflows", "fork", workflow_id, "--from-step", "0")
    assert bad_step.code == 1 and "1 or more" in bad_step.err
