"""The dashboard's workflow API through httpx (in-process ASGI), on real
PostgreSQL: the workflow list, a graph's nodes, edges and counts, and the
whole-workflow actions (cancel, retry, fork, signal) behind the token."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import httpx
import pytest

from pg_scheduler import JobSpec, WorkflowContext, chain, group, workflow
from pg_scheduler.dashboard import dashboard_app
from tests.support import workflow_ops_tasks as t
from tests.support.common import job_status, wait_for_status, wait_until

TOKEN = "wf-token"
AUTH = {"X-Dashboard-Token": TOKEN}
EVIL = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


@pytest.fixture(autouse=True)
def fresh() -> None:
    t.reset()


@pytest.fixture
async def client(pool):
    app = dashboard_app(pool, token=TOKEN)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dash"
    ) as c:
        yield c
    await app.state.dashboard.close()


@pytest.fixture
async def readonly(pool):
    app = dashboard_app(pool)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dash"
    ) as c:
        yield c
    await app.state.dashboard.close()


def now() -> datetime:
    return datetime.now(UTC)


def spec(name: str, fn=t.node) -> JobSpec:
    return JobSpec(fn, now(), (name,))


async def settled(pool: asyncpg.Pool, ids: list[str]) -> list[str | None]:
    async def done() -> bool:
        states = [await job_status(pool, i) for i in ids]
        return all(s not in ("pending", "running", "waiting") for s in states)

    await wait_until(done, message=f"jobs {ids} to end")
    return [await job_status(pool, i) for i in ids]


async def snapshot(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT job_id, status, attempts FROM scheduled_jobs ORDER BY job_id")


async def test_the_pages_are_the_shell_and_load_the_graph_script(client):
    for path, page in [("/workflows", "workflows"), ("/graph?id=x", "graph")]:
        response = await client.get(path)
        assert response.status_code == 200, path
        assert f'data-page="{page}"' in response.text
    shell = (await client.get("/")).text
    assert 'src="/static/graph.js"' in shell and 'data-nav="workflows"' in shell
    script = await client.get("/static/graph.js")
    assert script.status_code == 200 and "RENDER.graph" in script.text
    assert "innerHTML" not in script.text


async def test_the_workflow_list_and_its_filter(client, pool, make_scheduler):
    scheduler = await make_scheduler()
    ids = await scheduler.schedule_bulk(chain(spec("one"), group(spec("two"), spec("three"))))
    workflow_id = await scheduler.schedule(t.staged, args=(5,))
    await settled(pool, [*ids, workflow_id])
    data = (await client.get("/api/workflows")).json()
    listed = [(w["job_id"], w["kind"], w["status"]) for w in data["workflows"]]
    assert listed == [(workflow_id, "workflow", "completed"), (ids[0], "graph", "completed")]
    assert data["workflows"][0]["steps"] == 3
    assert data["workflows"][0]["created_at"].endswith("Z")
    assert (await client.get("/api/workflows?status=failed")).json()["workflows"] == []
    one = (await client.get("/api/workflows?limit=1")).json()["workflows"]
    assert [w["job_id"] for w in one] == [workflow_id]
    for bad in ("status=broken", "limit=0", "limit=501", "limit=many"):
        response = await client.get(f"/api/workflows?{bad}")
        assert response.status_code == 400, bad
        assert response.json()["error"], bad


async def test_a_graph_has_its_nodes_edges_and_counts(client, pool, make_scheduler):
    scheduler = await make_scheduler()
    t.failing.add("bad")
    flow = chain(spec("start"), group(spec("bad"), spec("fine")), spec("end"))
    ids = await scheduler.schedule_bulk(flow)
    alone = await scheduler.schedule(t.node, args=("alone",))
    assert await settled(pool, [*ids, alone]) == [
        "completed",
        "failed",
        "completed",
        "cancelled",
        "completed",
    ]
    # From any job of it: the whole graph, oldest first.
    for job_id in (ids[0], ids[3]):
        data = (await client.get(f"/api/graph?id={job_id}")).json()
        assert data["job_id"] == job_id
        assert [n["job_id"] for n in data["nodes"]] == ids
        assert data["counts"] == {"completed": 2, "failed": 1, "cancelled": 1}
        assert data["total"] == 4 and data["truncated"] is False
    edges = {(e["from"], e["to"]) for e in data["edges"]}
    assert edges == {(ids[0], ids[1]), (ids[0], ids[2]), (ids[1], ids[3]), (ids[2], ids[3])}
    node = {n["job_id"]: n for n in data["nodes"]}
    assert node[ids[1]]["task_name"] == "wfops.node"
    assert "bad failed on purpose" in node[ids[1]]["error_message"]
    assert node[ids[3]]["depends_on"] == [ids[1], ids[2]]
    assert node[ids[0]]["finished_at"].endswith("Z")
    # A job of no graph is a graph of one.
    single = (await client.get(f"/api/graph?id={alone}")).json()
    assert [n["job_id"] for n in single["nodes"]] == [alone] and single["edges"] == []
    missing = await client.get("/api/graph?id=no-such-job")
    assert missing.status_code == 404 and "no-such-job" in missing.json()["error"]
    assert (await client.get("/api/graph")).status_code == 400
    assert (await client.get("/api/graph?id=")).status_code == 400


async def test_a_graph_sends_markup_as_data_and_clips_long_errors(client, pool):
    await pool.execute(
        """
        INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,
                                    error_message, has_dependents)
        VALUES ('evil-1', $1, $1, now(), 'failed', $2, true),
               ('evil-2', 't', 't', now(), 'cancelled', NULL, false)
        """,
        EVIL,
        EVIL + "e" * 1000,
    )
    await pool.execute(
        "INSERT INTO job_dependencies (job_id, depends_on, ordinal) VALUES ('evil-2', 'evil-1', 0)"
    )
    data = (await client.get("/api/graph?id=evil-2")).json()
    first = data["nodes"][0]
    assert first["task_name"] == EVIL
    assert first["error_message"].startswith(EVIL) and len(first["error_message"]) == 500
    assert first["error_length"] == len(EVIL) + 1000


async def test_the_job_api_says_whether_a_job_is_part_of_a_graph(client, pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    first, second = spec("first"), spec("second")
    second = JobSpec(t.node, now(), ("second",), depends_on=[first])
    ids = await scheduler.schedule_bulk([first, second])
    alone = await scheduler.schedule(t.node, args=("alone",))
    for job_id, expected in ((ids[0], True), (ids[1], True), (alone, False)):
        data = (await client.get(f"/api/job?id={job_id}")).json()
        assert data["in_graph"] is expected, job_id


async def test_cancel_workflow_needs_the_token_and_cancels_the_whole_graph(
    client, readonly, pool, make_scheduler
):
    scheduler = await make_scheduler()
    flow = chain(spec("first"), spec("held", t.held), group(spec("a"), spec("b")))
    ids = await scheduler.schedule_bulk(flow)
    await wait_for_status(pool, ids[1], "running")
    before = await snapshot(pool)
    for headers in ({}, {"X-Dashboard-Token": "wrong"}, {"Authorization": "Bearer wrong"}):
        response = await client.post(
            "/api/action/cancel_workflow", json={"job_id": ids[2]}, headers=headers
        )
        assert response.status_code == 403, headers
    refused = await readonly.post(
        "/api/action/cancel_workflow", json={"job_id": ids[2]}, headers=AUTH
    )
    assert refused.status_code == 403 and "read-only" in refused.json()["error"]
    assert await snapshot(pool) == before
    ok = await client.post("/api/action/cancel_workflow", json={"job_id": ids[3]}, headers=AUTH)
    assert ok.status_code == 200, ok.text
    assert sorted(ok.json()["cancelled"]) == sorted(ids[1:])
    assert ok.json()["job_id"] == ids[3]
    assert await settled(pool, ids) == ["completed", "cancelled", "cancelled", "cancelled"]
    # Nothing left to cancel: an empty list, not an error.
    again = await client.post("/api/action/cancel_workflow", json={"job_id": ids[0]}, headers=AUTH)
    assert again.status_code == 200 and again.json()["cancelled"] == []
    unknown = await client.post(
        "/api/action/cancel_workflow", json={"job_id": "no-such-job"}, headers=AUTH
    )
    assert unknown.status_code == 404
    for payload in ({}, {"job_id": ""}, {"job_id": 42}):
        response = await client.post("/api/action/cancel_workflow", json=payload, headers=AUTH)
        assert response.status_code == 400, payload
    bad_body = await client.post(
        "/api/action/cancel_workflow",
        content=b"[1, 2]",
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert bad_body.status_code == 400


async def test_retry_workflow_lets_the_graph_go_on_and_refuses_what_it_cannot(
    client, readonly, pool, make_scheduler
):
    scheduler = await make_scheduler()
    t.failing.add("bad")
    ids = await scheduler.schedule_bulk(chain(spec("start"), spec("bad"), spec("end")))
    assert await settled(pool, ids) == ["completed", "failed", "cancelled"]
    before = await snapshot(pool)
    refused = await readonly.post("/api/action/retry_workflow", json={"job_id": ids[1]})
    assert refused.status_code == 403
    no_token = await client.post("/api/action/retry_workflow", json={"job_id": ids[1]})
    assert no_token.status_code == 403
    # A completed job, and a dependent whose dependency failed: 409, nothing written.
    done = await client.post("/api/action/retry_workflow", json={"job_id": ids[0]}, headers=AUTH)
    assert done.status_code == 409 and "only a failed" in done.json()["error"]
    held = await client.post("/api/action/retry_workflow", json={"job_id": ids[2]}, headers=AUTH)
    assert held.status_code == 409 and "retry that job first" in held.json()["error"]
    unknown = await client.post(
        "/api/action/retry_workflow", json={"job_id": "no-such-job"}, headers=AUTH
    )
    assert unknown.status_code == 404
    assert (
        await client.post("/api/action/retry_workflow", json={}, headers=AUTH)
    ).status_code == 400
    assert await snapshot(pool) == before
    t.failing.clear()
    ok = await client.post("/api/action/retry_workflow", json={"job_id": ids[1]}, headers=AUTH)
    assert ok.status_code == 200, ok.text
    assert ok.json() == {"job_id": ids[1], "retried": [ids[1], ids[2]]}
    assert await settled(pool, ids) == ["completed"] * 3
    assert t.runs == {"start": 1, "bad": 2, "end": 1}


async def test_retry_workflow_reruns_a_code_first_workflow_from_its_failed_step(
    client, pool, make_scheduler
):
    scheduler = await make_scheduler()
    t.failing.add("charge")
    job_id = await scheduler.schedule(t.staged, args=(1,))
    assert await settled(pool, [job_id]) == ["failed"]
    t.failing.clear()
    # A form post may carry the token as a field, as for the other actions.
    ok = await client.post("/api/action/retry_workflow", data={"job_id": job_id, "token": TOKEN})
    assert ok.status_code == 200, ok.text
    assert await scheduler.result(job_id, timeout=10) == 3
    assert t.runs == {"reserve": 1, "charge": 2, "ship": 1}


async def test_fork_workflow_from_a_number_or_a_name_and_bad_input(client, pool, make_scheduler):
    scheduler = await make_scheduler()
    original = await scheduler.schedule(t.staged, args=(1,))
    assert await scheduler.result(original, timeout=10) == 3
    before = await snapshot(pool)
    for step in (0, -1, True, 1.5, "", "  ", None, [2], {"seq": 2}):
        response = await client.post(
            "/api/action/fork_workflow", json={"job_id": original, "from_step": step}, headers=AUTH
        )
        assert response.status_code == 400, (step, response.text)
        assert "from_step" in response.json()["error"], step
    missing = await client.post(
        "/api/action/fork_workflow", json={"job_id": original}, headers=AUTH
    )
    assert missing.status_code == 400
    named = await client.post(
        "/api/action/fork_workflow",
        json={"job_id": original, "from_step": "no-such-step"},
        headers=AUTH,
    )
    assert named.status_code == 409 and "no step named" in named.json()["error"]
    unknown = await client.post(
        "/api/action/fork_workflow", json={"job_id": "no-such-job", "from_step": 1}, headers=AUTH
    )
    assert unknown.status_code == 404
    no_token = await client.post(
        "/api/action/fork_workflow", json={"job_id": original, "from_step": 2}
    )
    assert no_token.status_code == 403
    assert await snapshot(pool) == before
    for step, sent in ((2, 2), ("2", 2), ("charge", "charge")):
        ok = await client.post(
            "/api/action/fork_workflow",
            json={"job_id": original, "from_step": step},
            headers=AUTH,
        )
        assert ok.status_code == 200, ok.text
        data = ok.json()
        assert data["forked_from"] == original and data["from_step"] == sent
        assert data["job_id"] != original
        assert await scheduler.result(data["job_id"], timeout=10) == 3
    assert t.runs == {"reserve": 1, "charge": 4, "ship": 4}


async def test_a_fork_past_a_spawn_is_a_conflict(client, pool, make_scheduler):
    scheduler = await make_scheduler()
    t.release.set()
    parent = await scheduler.schedule(t.parent, args=(["a"],))
    assert await scheduler.result(parent, timeout=10) == ["a"]
    before = await snapshot(pool)
    response = await client.post(
        "/api/action/fork_workflow", json={"job_id": parent, "from_step": 3}, headers=AUTH
    )
    assert response.status_code == 409 and "not spawned children" in response.json()["error"]
    assert await snapshot(pool) == before


async def test_a_dashboard_on_the_applications_scheduler_stops_its_running_job(
    pool, make_scheduler
):
    scheduler = await make_scheduler()
    app = dashboard_app(scheduler, token=TOKEN)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://dash"
        ) as c:
            ids = await scheduler.schedule_bulk(chain(spec("held", t.held), spec("after")))
            await wait_for_status(pool, ids[0], "running")
            graph = (await c.get(f"/api/graph?id={ids[1]}")).json()
            assert graph["counts"] == {"running": 1, "waiting": 1}
            ok = await c.post("/api/action/cancel_workflow", json={"job_id": ids[0]}, headers=AUTH)
            assert ok.status_code == 200 and sorted(ok.json()["cancelled"]) == sorted(ids)
            assert await settled(pool, ids) == ["cancelled", "cancelled"]
            outcome = await pool.fetchval(
                "SELECT outcome FROM job_attempts WHERE job_id = $1", ids[0]
            )
            assert outcome == "cancelled"
    finally:
        await app.state.dashboard.close()
    assert t.runs["after"] == 0


@workflow(name="dash.approval")
async def approval(ctx: WorkflowContext) -> object:
    return await ctx.wait_for_signal("approved")


async def test_signal_workflow_needs_the_token_and_sends_once_by_its_key(
    client, readonly, pool, make_scheduler
):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(approval)
    await wait_for_status(pool, job_id, "waiting")
    body = {"job_id": job_id, "name": "approved", "payload": {"by": "ops"}, "idempotency_key": "d1"}
    assert (await readonly.post("/api/action/signal_workflow", json=body)).status_code == 403
    assert (await client.post("/api/action/signal_workflow", json=body)).status_code == 403
    for bad in (
        {"job_id": job_id},  # no name
        {"job_id": job_id, "name": ""},
        {"job_id": job_id, "name": "approved", "idempotency_key": ""},
        {"job_id": job_id, "name": "approved", "idempotency_key": 7},
        {"job_id": job_id, "name": "approved", "payload": "nul \x00"},
    ):
        refused = await client.post("/api/action/signal_workflow", json=bad, headers=AUTH)
        assert refused.status_code == 400, (bad, refused.text)
    unknown = await client.post(
        "/api/action/signal_workflow", json={**body, "job_id": "no-such-job"}, headers=AUTH
    )
    assert unknown.status_code == 404
    assert await pool.fetchval("SELECT count(*) FROM workflow_signals") == 0
    sent = await client.post("/api/action/signal_workflow", json=body, headers=AUTH)
    assert sent.status_code == 200, sent.text
    assert sent.json() == {"job_id": job_id, "signal": "approved", "stored": True}
    assert await scheduler.result(job_id, timeout=10) == {"by": "ops"}
    again = await client.post("/api/action/signal_workflow", json=body, headers=AUTH)
    assert again.status_code == 200 and again.json()["stored"] is False
    finished = await client.post(
        "/api/action/signal_workflow", json={**body, "idempotency_key": "d2"}, headers=AUTH
    )
    assert finished.status_code == 409 and "finished job" in finished.json()["error"]
    assert await pool.fetchval("SELECT count(*) FROM workflow_signals") == 1
