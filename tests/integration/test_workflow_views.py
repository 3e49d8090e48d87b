"""Workflows as operators see them: the dashboard's job page and lists, the
CLI's job views and status, stats() and the Prometheus figures. Every
workflow here really runs (steps, a sleep, a signal wait, a parent with
children) on real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import structlog

from pg_scheduler.cli import main, ops
from pg_scheduler.dashboard import dashboard_app
from pg_scheduler.observe.metrics import MetricsExporter
from pg_scheduler.store.workflow_views import CLIP, WorkflowViews
from tests.support import workflow_view_tasks as wf
from tests.support.common import wait_for_status, wait_until


def now() -> datetime:
    return datetime.now(UTC)


def parse(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


@dataclass
class Parked:
    sleeping: str  # wfv.sleeper: two steps, then a two-hour sleep
    approving: str  # wfv.approval (queue "approvals"): waits for "approved"; a "note" unread
    parent: str  # wfv.fan_out: three children (one fails), gathered
    children: list[str]
    plain: str  # a plain job, completed


@pytest.fixture
async def parked(pool, make_scheduler):
    """Three parked workflows and a parent's children held at the gate."""
    wf.gate.clear()
    scheduler = await make_scheduler()
    sleeping = await scheduler.schedule(wf.sleeper, execution_time=now(), args=(3,))
    approving = await scheduler.schedule(
        wf.approval, execution_time=now(), args=("o-1",), queue="approvals"
    )
    await scheduler.signal(approving, "note", {"x": 1}, idempotency_key="note-1")
    parent = await scheduler.schedule(wf.fan_out, execution_time=now(), args=([1, 2, -1],))
    plain = await scheduler.schedule(wf.quick, execution_time=now(), args=(7,))
    for job_id in (sleeping, approving, parent):
        await wait_for_status(pool, job_id, "waiting")
    await wait_for_status(pool, plain, "completed")
    children = [
        r["job_id"]
        for r in await pool.fetch(
            "SELECT job_id FROM scheduled_jobs WHERE parent_job_id = $1 ORDER BY parent_seq",
            parent,
        )
    ]
    assert len(children) == 3
    for child in children:
        await wait_for_status(pool, child, "running")
    try:
        yield scheduler, Parked(sleeping, approving, parent, children, plain)
    finally:
        wf.gate.set()


@pytest.fixture
async def client(pool):
    app = dashboard_app(pool, token="t")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dash"
    ) as c:
        yield c
    await app.state.dashboard.close()


async def get(client: httpx.AsyncClient, path: str) -> Any:
    response = await client.get(path)
    assert response.status_code == 200, response.text
    return response.json()


def kinds(steps: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(s["seq"], s["kind"], s["name"], s["status"]) for s in steps]


# -- the dashboard ------------------------------------------------------------------------


async def test_job_page_of_a_sleeping_workflow_shows_its_steps_and_wake_time(client, parked):
    _, p = parked
    job = await get(client, f"/api/job?id={p.sleeping}")
    assert job["status"] == "waiting"
    w = job["workflow"]
    assert w["wait"]["kind"] == "sleep"
    assert abs(parse(w["wait"]["until"]) - (now() + timedelta(hours=2))) < timedelta(minutes=1)
    assert kinds(w["steps"]) == [
        (1, "step", "double", "completed"),
        (2, "step", "describe", "completed"),
        (3, "sleep", "sleep", "waiting"),
    ]
    double, describe, sleep = w["steps"]
    assert double["result"] == "6" and double["error"] is None and double["attempts"] == 1
    assert double["duration"] is not None and 0 <= double["duration"] < 5
    # A long result is clipped, its length given.
    assert len(describe["result"]) == CLIP
    assert describe["result_length"] == len(json.dumps({"text": wf.LONG}))
    assert sleep["duration"] is None
    assert w["steps_total"] == 3 and w["steps_next"] is None
    assert w["children_total"] == 0 and w["children"] == []
    assert w["signals_total"] == 0 and w["parent"] is None


async def test_job_page_of_a_workflow_waiting_for_a_signal_shows_unread_signals(
    client, parked, pool
):
    scheduler, p = parked
    w = (await get(client, f"/api/job?id={p.approving}"))["workflow"]
    assert w["wait"]["kind"] == "signal" and w["wait"]["signal"] == "approved"
    assert abs(parse(w["wait"]["until"]) - (now() + timedelta(days=7))) < timedelta(minutes=1)
    assert kinds(w["steps"]) == [
        (1, "step", "reserve", "completed"),
        (2, "signal", "approved", "waiting"),
    ]
    assert w["signals_total"] == 1
    [note] = w["signals"]
    assert note["name"] == "note" and json.loads(note["payload"]) == {"x": 1}
    assert note["idempotency_key"] == "note-1"
    # The awaited signal comes: the workflow ends, nothing is left unread but the note.
    await scheduler.signal(p.approving, "approved", {"by": "ops"})
    await wait_for_status(pool, p.approving, "completed")
    job = await get(client, f"/api/job?id={p.approving}")
    w = job["workflow"]
    assert w["wait"] is None
    assert kinds(w["steps"])[-1] == (2, "signal", "approved", "completed")
    assert json.loads(w["steps"][-1]["result"]) == {"payload": {"by": "ops"}}
    assert [g["name"] for g in w["signals"]] == ["note"]


async def test_job_page_of_a_parent_lists_its_children_and_a_child_links_back(client, parked, pool):
    _, p = parked
    w = (await get(client, f"/api/job?id={p.parent}"))["workflow"]
    assert w["wait"]["kind"] == "children" and w["wait"]["children"] == 3
    assert kinds(w["steps"]) == [
        (1, "step", "plan", "completed"),
        (2, "spawn", "wfv.child", "waiting"),
        (3, "spawn", "wfv.child", "waiting"),
        (4, "spawn", "wfv.child", "waiting"),
        (5, "wait", "gather", "waiting"),
    ]
    assert [s["child_job_id"] for s in w["steps"][1:4]] == p.children
    assert w["children_total"] == 3
    assert [c["job_id"] for c in w["children"]] == p.children
    assert {c["task_name"] for c in w["children"]} == {"wfv.child"}
    assert w["children_counts"] == {"running": 3}
    child = await get(client, f"/api/job?id={p.children[0]}")
    assert child["workflow"]["parent"] == {
        "job_id": p.parent,
        "seq": 2,
        "task_name": "wfv.fan_out",
        "status": "waiting",
    }
    assert child["workflow"]["steps"] == [] and child["workflow"]["wait"] is None
    # A plain job has no workflow section.
    assert (await get(client, f"/api/job?id={p.plain}"))["workflow"] is None

    wf.gate.set()
    await wait_for_status(pool, p.parent, "completed")
    w = (await get(client, f"/api/job?id={p.parent}"))["workflow"]
    assert w["wait"] is None
    assert w["children_counts"] == {"completed": 2, "failed": 1}
    assert [c["status"] for c in w["children"]] == ["completed", "completed", "failed"]
    assert "negative: -1" in w["children"][2]["error"]
    assert {s["status"] for s in w["steps"]} == {"completed"}
    assert json.loads(w["steps"][1]["result"])["outcome"]["result"] == 10


async def test_lists_and_overview_count_waiting(client, parked):
    _, p = parked
    page = await get(client, "/api/jobs?status=waiting")
    rows = {j["job_id"]: j for j in page["jobs"]}
    assert set(rows) == {p.sleeping, p.approving, p.parent}
    assert rows[p.sleeping]["wait_kind"] == "sleep" and rows[p.sleeping]["wake_at"]
    assert rows[p.approving]["wait_kind"] == "signal"
    assert rows[p.approving]["wait_for"] == "approved"
    assert rows[p.parent]["wait_kind"] == "children"
    every = await get(client, "/api/jobs")
    child_rows = [j for j in every["jobs"] if j["job_id"] in p.children]
    assert {j["parent_job_id"] for j in child_rows} == {p.parent}
    overview = await get(client, "/api/overview")
    assert overview["counts"]["waiting"] == 3
    assert overview["counts"]["running"] == 3
    tasks = {t["task"]: t["counts"] for t in overview["tasks"]}
    assert tasks["wfv.sleeper"]["waiting"] == 1 and tasks["wfv.fan_out"]["waiting"] == 1
    queues = {q["queue"]: q["counts"] for q in overview["queues"]}
    assert queues["approvals"] == {"waiting": 1}
    assert queues["default"]["waiting"] == 2
    assert (await get(client, "/api/queues"))["queues"]


async def test_a_parked_workflow_can_be_cancelled_from_the_dashboard(client, parked, pool):
    _, p = parked
    response = await client.post(
        "/api/action/cancel", json={"job_id": p.parent}, headers={"X-Dashboard-Token": "t"}
    )
    assert response.status_code == 200, response.text
    await wait_for_status(pool, p.parent, "cancelled")
    for child in p.children:  # its children go with it
        await wait_for_status(pool, child, "cancelled")
    response = await client.post(
        "/api/action/cancel", json={"job_id": p.parent}, headers={"X-Dashboard-Token": "t"}
    )
    assert response.status_code == 409
    assert "pending, running or waiting" in response.json()["error"]


async def test_steps_and_children_come_a_page_at_a_time(client, pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(wf.many_steps, execution_time=now(), args=(250, 205))
    await wait_for_status(pool, job_id, "completed", timeout=60)
    seqs: list[int] = []
    after = None
    pages = 0
    while True:
        query = f"/api/job?id={job_id}" + (f"&steps_after={after}" if after else "")
        w = (await get(client, query))["workflow"]
        assert w["steps_total"] == 250 + 205 + 1
        assert len(w["steps"]) <= 200
        seqs += [s["seq"] for s in w["steps"]]
        pages += 1
        after = w["steps_next"]
        if after is None:
            break
        assert after == seqs[-1]
    assert pages == 3 and seqs == list(range(1, 457))
    w = (await get(client, f"/api/job?id={job_id}"))["workflow"]
    assert w["children_total"] == 205 and len(w["children"]) == 200
    assert w["children_counts"] == {"completed": 205}
    rest = (await get(client, f"/api/job?id={job_id}&children_after={w['children_next']}"))[
        "workflow"
    ]
    assert len(rest["children"]) == 5 and rest["children_next"] is None
    ids = [c["job_id"] for c in w["children"] + rest["children"]]
    assert len(set(ids)) == 205
    for bad in ("abc", "-1"):
        response = await client.get(f"/api/job?id={job_id}&steps_after={bad}")
        assert response.status_code == 400 and "steps_after" in response.json()["error"]


async def test_views_in_a_schema_of_their_own(pool, make_scheduler):
    schema = "wf_views"
    await pool.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    scheduler = await make_scheduler(schema=schema)
    app = dashboard_app(pool, schema=schema)
    try:
        job_id = await scheduler.schedule(wf.approval, execution_time=now(), args=("s-1",))

        async def parked() -> bool:
            status = f"SELECT status FROM {schema}.scheduled_jobs WHERE job_id = $1"
            return await pool.fetchval(status, job_id) == "waiting"

        await wait_until(parked, message="the park on the signal")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://dash"
        ) as c:
            w = (await get(c, f"/api/job?id={job_id}"))["workflow"]
            assert w["wait"]["signal"] == "approved" and w["steps_total"] == 2
            assert (await get(c, "/api/overview"))["counts"]["waiting"] == 1
        assert (await scheduler.stats()).counts["waiting"] == 1
        assert {q.queue: q.waiting for q in (await scheduler.stats()).by_queue} == {"default": 1}
        # Nothing of it in the public schema's views.
        assert await WorkflowViews(pool).waits([job_id]) == {}
        assert await WorkflowViews(pool).waiting_by_queue() == {}
    finally:
        await app.state.dashboard.close()
        await scheduler.shutdown()
        await pool.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def test_views_of_a_schema_without_workflows(pool):
    views = WorkflowViews(pool, "no_workflows_here")
    assert await views.available() is False
    assert await views.waits(["x"]) == {}
    assert await views.waiting_by_queue() == {}


# -- stats() and the exporter ---------------------------------------------------------------


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


async def test_stats_count_waiting_per_task_and_queue(parked):
    scheduler, _ = parked
    stats = await scheduler.stats()
    assert stats.counts["waiting"] == 3
    tasks = {t.task_name: t for t in stats.by_task}
    assert tasks["wfv.sleeper"].waiting == 1
    assert tasks["wfv.approval"].waiting == 1
    assert tasks["wfv.fan_out"].waiting == 1
    assert tasks["wfv.child"].running == 3 and tasks["wfv.child"].waiting == 0
    queues = {q.queue: q for q in stats.by_queue}
    assert queues["approvals"].waiting == 1 and queues["approvals"].pending == 0
    assert queues["default"].waiting == 2 and queues["default"].running == 3
    async with MetricsExporter(scheduler, port=0, addr="127.0.0.1", interval=0.1) as exporter:
        text = await asyncio.to_thread(scrape, exporter.port)
    assert 'pg_scheduler_jobs{status="waiting",task="wfv.sleeper"} 1.0' in text
    assert 'pg_scheduler_queue_jobs{queue="approvals",state="waiting"} 1.0' in text


# -- the command line -----------------------------------------------------------------------


@pytest.fixture
def _quiet_cli(monkeypatch):
    # The command runs in-process beside the test's scheduler: leave logging alone.
    monkeypatch.setattr(ops, "configure_logging", lambda args: None)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.__stderr__))
    yield
    structlog.reset_defaults()


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


async def cli(dsn: str, *argv: str) -> str:
    code, out, err = await asyncio.to_thread(_run, ["--dsn", dsn, "--log-level", "warning", *argv])
    assert code == 0, err
    return out


@pytest.mark.usefixtures("_quiet_cli")
async def test_cli_job_views_show_waits_steps_children_and_signals(dsn, parked):
    _, p = parked
    listing = await cli(dsn, "jobs", "--status", "waiting")
    assert "waits for" in listing
    assert 'signal "approved" until' in listing
    assert "sleep until" in listing
    assert "3 children to end" in listing
    plain = await cli(dsn, "jobs", "--status", "completed")
    assert "waits for" not in plain and p.plain in plain

    parent = await cli(dsn, "jobs", p.parent)
    assert "steps: 5" in parent and "spawn" in parent and "gather" in parent
    assert "children: 3 (3 running)" in parent
    for child in p.children:
        assert child in parent
    sleeping = await cli(dsn, "jobs", p.sleeping)
    assert "sleep until" in sleeping and "describe" in sleeping and "…" in sleeping
    approving = await cli(dsn, "jobs", p.approving)
    assert "unread signals: 1" in approving and "note" in approving and "note-1" in approving
    child = await cli(dsn, "jobs", p.children[0])
    assert f"{p.parent} (wfv.fan_out, waiting; step 2)" in child
    assert "steps:" not in child
    plain_detail = await cli(dsn, "jobs", p.plain)
    assert "steps:" not in plain_detail and "waits for" not in plain_detail

    data = json.loads(await cli(dsn, "jobs", "--json", p.parent))
    assert data["wait"]["kind"] == "children" and data["wait"]["children"] == 3
    assert data["workflow"]["steps_total"] == 5
    assert [c["job_id"] for c in data["workflow"]["children"]] == p.children
    assert data["workflow"]["children_counts"] == {"running": 3}
    rows = json.loads(await cli(dsn, "jobs", "--json"))
    by_id = {r["job_id"]: r for r in rows}
    assert by_id[p.approving]["wait"]["signal"] == "approved"
    assert by_id[p.children[1]]["parent_job_id"] == p.parent
    assert by_id[p.plain]["wait"] is None and by_id[p.plain]["parent_job_id"] is None
    assert "workflow" not in json.loads(await cli(dsn, "jobs", "--json", p.plain))

    status = await cli(dsn, "status")
    assert "3 waiting" in status and "waiting" in status.split("Jobs by task")[1]
    stats = json.loads(await cli(dsn, "status", "--json"))
    assert stats["counts"]["waiting"] == 3
    assert {q["queue"]: q["waiting"] for q in stats["by_queue"]}["approvals"] == 1

    # Once the children end, the parent's view says so.
    wf.gate.set()
    await wait_for_status_cli(dsn, p.parent)
    parent = await cli(dsn, "jobs", p.parent)
    assert "children: 3 (2 completed, 1 failed)" in parent


async def wait_for_status_cli(dsn: str, job_id: str) -> None:
    async def done() -> bool:
        return json.loads(await cli(dsn, "jobs", "--json", job_id))["status"] == "completed"

    await wait_until(done, timeout=15, message=f"{job_id} to complete")
