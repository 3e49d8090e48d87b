"""The dashboard's JSON API and HTML, through httpx (in-process ASGI), on real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime

import asyncpg
import httpx
import pytest

from pg_scheduler import RetryPolicy
from pg_scheduler.dashboard import dashboard_app
from pg_scheduler.store.dashboard import Catalog, DashboardStore
from pg_scheduler.store.jobs import Store
from pg_scheduler.store.migrate import migrate
from tests.support import dashboard_tasks
from tests.support.common import wait_for_status, wait_until
from tests.support.dashboard_support import serve

TOKEN = "s3cret-token"
EVIL = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def now() -> datetime:
    return datetime.now(UTC)


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


async def add_jobs(pool, n: int, task: str = "dash.echo", status: str = "pending", **extra):
    """n rows straight into the table, created one millisecond apart."""
    await pool.execute(
        """
        INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,
                                    created_at, task_data)
        SELECT $1 || g, $2, $2, now() + interval '1 hour', $3,
               now() - make_interval(secs => g / 1000.0),
               jsonb_build_object('args', jsonb_build_array('arg-' || g), 'kwargs', '{}'::jsonb)
          FROM generate_series(1, $4) g
        """,
        extra.get("prefix", f"{task}-{status}-"),
        task,
        status,
        n,
    )


async def test_every_page_is_the_shell_with_its_base_path(client):
    for path, page in [
        ("/", "overview"),
        ("/jobs", "jobs"),
        ("/job?id=x", "job"),
        ("/workers", "workers"),
        ("/queues", "queues"),
        ("/periodic", "periodic"),
    ]:
        response = await client.get(path)
        assert response.status_code == 200, path
        assert f'data-page="{page}"' in response.text
        assert 'data-readonly="false"' in response.text
    assert (await client.get("/nope")).status_code == 404
    script = await client.get("/static/app.js")
    assert script.status_code == 200 and "EventSource" in script.text
    css = await client.get("/static/style.css")
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]
    # No outside network: every asset the shell names is served from here.
    shell = (await client.get("/")).text
    assert "http://" not in shell and "https://" not in shell and "//cdn" not in shell


async def test_mounted_under_a_prefix_in_fastapi(pool):
    from fastapi import FastAPI

    outer = FastAPI()
    inner = dashboard_app(pool)
    outer.mount("/jobs-ui", inner)
    transport = httpx.ASGITransport(app=outer)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as c:
        shell = await c.get("/jobs-ui/workers")
        assert shell.status_code == 200
        assert 'data-base="/jobs-ui"' in shell.text
        assert 'href="/jobs-ui/static/app.js"' not in shell.text  # script, not a link
        assert 'src="/jobs-ui/static/app.js"' in shell.text
        assert (await c.get("/jobs-ui/static/app.js")).status_code == 200
        assert (await c.get("/jobs-ui/api/overview")).json()["total"] == 0
    await inner.state.dashboard.close()


async def test_overview_counts_queues_and_series(client, pool):
    await add_jobs(pool, 3, status="pending")
    await add_jobs(pool, 2, task="dash.boom", status="failed")
    await pool.execute(
        "UPDATE scheduled_jobs SET finished_at = now() - interval '30 seconds' "
        "WHERE status = 'failed'"
    )
    await add_jobs(pool, 4, status="completed")
    await pool.execute("UPDATE scheduled_jobs SET finished_at = now() WHERE status = 'completed'")
    data = (await client.get("/api/overview")).json()
    assert data["counts"]["pending"] == 3
    assert data["counts"]["failed"] == 2
    assert data["counts"]["completed"] == 4
    assert data["total"] == 9
    assert data["oldest_due_seconds"] is None  # due in an hour
    assert [q["queue"] for q in data["queues"]] == ["default"]
    assert data["queues"][0]["counts"] == {"pending": 3, "failed": 2, "completed": 4}
    assert {t["task"] for t in data["tasks"]} == {"dash.echo", "dash.boom"}
    points = data["series"]["points"]
    assert sum(p.get("completed", 0) for p in points) == 4
    assert sum(p.get("failed", 0) for p in points) == 2
    assert data["windows"]["300"]["failure_rate"] == pytest.approx(2 / 6)


async def test_keyset_pages_cover_every_row_once_newest_first(client, pool):
    await add_jobs(pool, 70, status="pending")
    await add_jobs(pool, 55, status="completed")
    seen: list[dict] = []
    cursor = None
    pages = 0
    while True:
        url = "/api/jobs?limit=50" + (f"&after={cursor}" if cursor else "")
        data = (await client.get(url)).json()
        seen += data["jobs"]
        pages += 1
        cursor = data["next"]
        if cursor is None:
            break
    assert pages == 3
    ids = [j["job_id"] for j in seen]
    assert len(ids) == len(set(ids)) == 125
    keys = [(j["created_at"], j["job_id"]) for j in seen]
    assert keys == sorted(keys, reverse=True)


async def test_filters_status_task_time_and_search(client, pool):
    await add_jobs(pool, 10, status="pending")
    await add_jobs(pool, 5, task="dash.boom", status="failed")
    failed = (await client.get("/api/jobs?status=failed")).json()["jobs"]
    assert len(failed) == 5 and {j["status"] for j in failed} == {"failed"}
    both = (await client.get("/api/jobs?status=failed,pending&task=dash.boom")).json()["jobs"]
    assert {j["task_name"] for j in both} == {"dash.boom"}
    found = (await client.get("/api/jobs?q=ARG-3")).json()["jobs"]  # case-insensitive
    assert {j["job_id"] for j in found} == {"dash.echo-pending-3", "dash.boom-failed-3"}
    by_id = (await client.get("/api/jobs?q=dash.boom-failed-3")).json()["jobs"]
    assert [j["job_id"] for j in by_id] == ["dash.boom-failed-3"]
    await pool.execute(
        "UPDATE scheduled_jobs SET created_at = now() - interval '2 days' "
        "WHERE job_id = 'dash.echo-pending-1'"
    )
    recent = (await client.get("/api/jobs?since=1d")).json()["jobs"]
    assert len(recent) == 14
    old = (await client.get("/api/jobs?until=1d")).json()["jobs"]
    assert [j["job_id"] for j in old] == ["dash.echo-pending-1"]
    assert (await client.get("/api/jobs?queue=default")).json()["jobs"]
    assert (await client.get("/api/jobs?queue=other")).json()["jobs"] == []
    for bad in ("status=nope", "limit=0", "limit=x", "since=yesterday", "after=!!"):
        response = await client.get(f"/api/jobs?{bad}")
        assert response.status_code == 400, bad
        assert response.json()["error"]


async def test_the_batch_a_job_ran_in_and_the_jobs_of_a_batch(client, pool):
    await add_jobs(pool, 4, status="completed")
    batch = str(uuid.uuid4())
    await pool.execute(
        "INSERT INTO scheduler_batches (batch_id, task_name, queue, batch_size, job_ids)"
        " VALUES ($1, 'dash.echo', 'default', 3, ARRAY['dash.echo-completed-1',"
        " 'dash.echo-completed-2', 'dash.echo-completed-3'])",
        batch,
    )
    data = (await client.get("/api/job?id=dash.echo-completed-2")).json()
    assert (data["batch_id"], data["batch_size"]) == (batch, 3)
    plain = (await client.get("/api/job?id=dash.echo-completed-4")).json()
    assert (plain["batch_id"], plain["batch_size"]) == (None, None)
    listed = (await client.get(f"/api/jobs?batch={batch}")).json()["jobs"]
    assert [j["job_id"] for j in listed] == [f"dash.echo-completed-{n}" for n in (1, 2, 3)]
    assert {(j["batch_id"], j["batch_size"]) for j in listed} == {(batch, 3)}
    # With the other filters, and a page at a time.
    page = (await client.get(f"/api/jobs?batch={batch}&status=completed&limit=2")).json()
    assert len(page["jobs"]) == 2 and page["next"]
    rest = (await client.get(f"/api/jobs?batch={batch}&limit=2&after={page['next']}")).json()
    assert [j["job_id"] for j in rest["jobs"]] == ["dash.echo-completed-3"]
    assert (await client.get(f"/api/jobs?batch={uuid.uuid4()}")).json()["jobs"] == []
    assert (await client.get(f"/api/jobs?batch={batch}&status=failed")).json()["jobs"] == []
    bad = await client.get("/api/jobs?batch=nope")
    assert bad.status_code == 400 and "batch" in bad.json()["error"]
    # The list uses the indexes: the batch's row by its key, then each of its
    # jobs by the primary key (no scan of scheduled_jobs); a job's batch, the
    # GIN index on job_ids. With enough rows for the planner to choose them.
    await pool.execute(
        "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
        " finished_at) SELECT 'filler-' || n, 'f', 'f', now(), 'completed', now()"
        " FROM generate_series(1, 5000) n;"
        "INSERT INTO scheduler_batches (batch_id, task_name, queue, batch_size, job_ids)"
        " SELECT gen_random_uuid(), 'f', 'default', 1, ARRAY['filler-' || n % 5000]"
        " FROM generate_series(1, 20000) n;"
        "ANALYZE scheduled_jobs, scheduler_batches"
    )
    store = await DashboardStore.open(pool)
    assert store._list_batch is not None
    plan_args = (["completed"], None, None, None, None, None, 50, None, batch)
    plan = "\n".join(r[0] for r in await pool.fetch("EXPLAIN " + store._list_batch, *plan_args))
    assert "Seq Scan on scheduled_jobs" not in plan and "scheduled_jobs_pkey" in plan, plan
    # A job's batch: the batches naming it, by the GIN index, never a walk of
    # the newest batches (scheduler_batches_started_idx).
    for sql, args in (
        (store._list_batch, plan_args),
        (Store(pool)._get_job, ("dash.echo-completed-2",)),
    ):
        plan = "\n".join(r[0] for r in await pool.fetch("EXPLAIN " + sql, *args))
        assert "scheduler_batches_jobs_idx" in plan, plan
        assert "scheduler_batches_started_idx" not in plan and "Seq Scan" not in plan, plan
    data = (await client.get("/api/job?id=dash.echo-completed-2")).json()
    assert (data["batch_id"], data["batch_size"]) == (batch, 3)
    assert [j["job_id"] for j in (await client.get(f"/api/jobs?batch={batch}")).json()["jobs"]] == [
        f"dash.echo-completed-{n}" for n in (1, 2, 3)
    ]
    await pool.execute(
        "DELETE FROM scheduled_jobs WHERE job_id LIKE 'filler-%';"
        "DELETE FROM scheduler_batches WHERE task_name = 'f'"
    )
    # A schema without the batch table (before migration 0020): no job is of a batch.
    store = DashboardStore(pool, catalog=Catalog(True, True, True, has_batches=False))
    assert [r["batch_id"] for r in await store.list_jobs()] == [None] * 4
    assert await store.list_jobs(batch_id=batch) == []


async def test_job_detail_attempts_timeline_and_escaping(client, pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        dashboard_tasks.boom,
        execution_time=now(),
        args=(EVIL,),
        max_retries=1,
        retry_policy=RetryPolicy(base_delay=0.01, factor=1, max_delay=0.01, jitter=0),
    )
    await wait_for_status(pool, job_id, "failed", timeout=20)
    data = (await client.get(f"/api/job?id={job_id}")).json()
    assert data["status"] == "failed" and data["queue"] == "default"
    assert data["args"] == [EVIL]  # raw in JSON; the page renders it as text
    assert [a["outcome"] for a in data["attempt_history"]] == ["failed", "failed"]
    assert "ValueError: boom" in data["attempt_history"][0]["traceback"]
    whats = [t["what"] for t in data["timeline"]]
    assert whats[0] == "created" and whats[-1] == "failed"
    assert "attempt 1 failed" in whats
    # The HTML never carries job data, so nothing in it can be markup from a job.
    for path in ("/", "/jobs", f"/job?id={job_id}"):
        assert "__pwned" not in (await client.get(path)).text
    listed = (await client.get("/api/jobs")).json()["jobs"][0]
    assert "<script>window.__pwned = 1</script>" in listed["args"]
    missing = await client.get("/api/job?id=nope")
    assert missing.status_code == 404 and "nope" in missing.json()["error"]


async def test_actions_need_the_token(client, pool):
    await add_jobs(pool, 2, status="pending", prefix="a")
    headers = {"X-Dashboard-Token": TOKEN}
    for attempt in (
        {},
        {"headers": {"X-Dashboard-Token": "wrong"}},
        {"headers": {"Authorization": "Bearer wrong"}},
        # The token in a JSON body is not enough: JS must send the header.
        {"json_token": True},
    ):
        payload = {"job_id": "a1"}
        if attempt.get("json_token"):
            payload["token"] = TOKEN
        response = await client.post(
            "/api/action/cancel", json=payload, headers=attempt.get("headers", {})
        )
        assert response.status_code == 403, attempt
    assert await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = 'a1'") == "pending"
    ok = await client.post("/api/action/cancel", json={"job_id": "a1"}, headers=headers)
    assert ok.status_code == 200 and ok.json() == {"cancelled": "a1"}
    again = await client.post("/api/action/cancel", json={"job_id": "a1"}, headers=headers)
    assert again.status_code == 409 and "is cancelled" in again.json()["error"]
    retried = await client.post("/api/action/retry", json={"job_id": "a1"}, headers=headers)
    assert retried.status_code == 200
    assert await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = 'a1'") == "pending"
    # A plain HTML form may carry the token as a field.
    form = await client.post("/api/action/cancel", data={"job_id": "a2", "token": TOKEN})
    assert form.status_code == 200
    bearer = await client.post(
        "/api/action/retry", json={"job_id": "a2"}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert bearer.status_code == 200
    unknown = await client.post("/api/action/cancel", json={"job_id": "zz"}, headers=headers)
    assert unknown.status_code == 404
    assert (await client.post("/api/action/explode", json={}, headers=headers)).status_code == 404
    no_id = await client.post("/api/action/cancel", json={}, headers=headers)
    assert no_id.status_code == 400
    assert (await client.get("/api/action/cancel")).status_code == 405


async def test_read_only_refuses_every_action(readonly, pool):
    await add_jobs(pool, 1, status="failed", prefix="r")
    assert 'data-readonly="true"' in (await readonly.get("/")).text
    for name, payload in [
        ("retry", {"job_id": "r1"}),
        ("cancel", {"job_id": "r1"}),
        ("pause", {"queue": "default"}),
        ("resume", {"queue": "default"}),
        ("enable", {"key": "k"}),
        ("disable", {"key": "k"}),
        ("trigger", {"key": "k"}),
    ]:
        response = await readonly.post(
            f"/api/action/{name}", json=payload, headers={"X-Dashboard-Token": "anything"}
        )
        assert response.status_code == 403, name
        assert "read-only" in response.json()["error"]
    assert await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = 'r1'") == "failed"


async def test_periodic_list_enable_disable(client, pool):
    await pool.execute(
        """
        INSERT INTO periodic_jobs (dedup_key, job_name, task_name, schedule, enabled,
                                   code_enabled, next_run)
        VALUES ('dash-key', 'nightly', 'periodic:dash-key', 'every 3600s', true, true,
                now() + interval '1 hour')
        """
    )
    rows = (await client.get("/api/periodic")).json()["periodic"]
    assert [(r["dedup_key"], r["enabled"]) for r in rows] == [("dash-key", True)]
    headers = {"X-Dashboard-Token": TOKEN}
    off = await client.post("/api/action/disable", json={"key": "dash-key"}, headers=headers)
    assert off.status_code == 200
    assert await pool.fetchval("SELECT enabled FROM periodic_jobs") is False
    on = await client.post("/api/action/enable", json={"key": "nightly"}, headers=headers)
    assert on.status_code == 200 and on.json()["dedup_key"] == "dash-key"
    assert await pool.fetchval("SELECT enabled FROM periodic_jobs") is True
    # Its function is not registered in this process: a clear refusal.
    trigger = await client.post("/api/action/trigger", json={"key": "dash-key"}, headers=headers)
    assert trigger.status_code == 409 and "not registered" in trigger.json()["error"]
    missing = await client.post("/api/action/enable", json={"key": "nope"}, headers=headers)
    assert missing.status_code == 404


async def test_workers_show_running_jobs(client, pool, make_scheduler):
    dashboard_tasks.gate.clear()
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(dashboard_tasks.gated, execution_time=now(), args=(1,))
    await wait_for_status(pool, job_id, "running")

    async def listed() -> bool:
        data = (await client.get("/api/workers")).json()
        mine = [w for w in data["workers"] if w["worker_id"] == scheduler.worker_id]
        return bool(mine) and [r["job_id"] for r in mine[0]["running"]] == [job_id]

    await wait_until(listed, message="the worker with its running job")
    worker = next(
        w
        for w in (await client.get("/api/workers")).json()["workers"]
        if w["worker_id"] == scheduler.worker_id
    )
    assert worker["alive"] and worker["pid"] > 0 and "dash.gated" in worker["tasks"]
    dashboard_tasks.gate.set()
    await wait_for_status(pool, job_id, "completed")


async def test_named_queues_when_the_schema_has_them(dsn):
    # The shape the queues work adds: a queue column and a scheduler_queues table.
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    try:
        await pool.execute("DROP SCHEMA IF EXISTS dash_q CASCADE")
        await migrate(pool, "dash_q")
        await pool.execute(
            """
            ALTER TABLE dash_q.scheduled_jobs
                ADD COLUMN IF NOT EXISTS queue TEXT NOT NULL DEFAULT 'default';
            CREATE TABLE IF NOT EXISTS dash_q.scheduler_queues (
                name TEXT PRIMARY KEY, paused BOOLEAN NOT NULL DEFAULT false);
            ALTER TABLE dash_q.scheduler_queues ADD COLUMN IF NOT EXISTS concurrency INTEGER;
            INSERT INTO dash_q.scheduler_queues (name, concurrency) VALUES ('mail', 3);
            INSERT INTO dash_q.scheduled_jobs (job_id, job_name, task_name, execution_time, queue)
            VALUES ('m1', 't', 't', now(), 'mail'), ('m2', 't', 't', now(), 'mail'),
                   ('d1', 't', 't', now(), 'default');
            """
        )
        app = dashboard_app(pool, token=TOKEN, schema="dash_q")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
            data = (await c.get("/api/queues")).json()
            assert data["named_queues"] is True
            by_name = {q["queue"]: q for q in data["queues"]}
            assert by_name["mail"]["counts"] == {"pending": 2}
            assert by_name["mail"]["settings"]["concurrency"] == 3
            assert by_name["default"]["counts"] == {"pending": 1}
            mail = (await c.get("/api/jobs?queue=mail")).json()["jobs"]
            assert {(j["job_id"], j["queue"]) for j in mail} == {("m1", "mail"), ("m2", "mail")}
            assert (await c.get("/api/job?id=m1")).json()["queue"] == "mail"
            headers = {"X-Dashboard-Token": TOKEN}
            paused = await c.post("/api/action/pause", json={"queue": "mail"}, headers=headers)
            assert paused.status_code == 200
            assert await pool.fetchval(
                "SELECT paused FROM dash_q.scheduler_queues WHERE name = 'mail'"
            )
            resumed = await c.post("/api/action/resume", json={"queue": "mail"}, headers=headers)
            assert resumed.status_code == 200
            assert not await pool.fetchval(
                "SELECT paused FROM dash_q.scheduler_queues WHERE name = 'mail'"
            )
        await app.state.dashboard.close()
    finally:
        await pool.execute("DROP SCHEMA IF EXISTS dash_q CASCADE")
        await pool.close()


async def test_event_stream_reports_changes(pool, make_scheduler):
    app = dashboard_app(pool, token=TOKEN)
    scheduler = await make_scheduler()
    try:
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            async with http.stream("GET", "/api/stream") as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                lines = stream.aiter_lines()

                async def next_event() -> tuple[str, dict]:
                    kind = ""
                    async for line in lines:
                        if line.startswith("event: "):
                            kind = line[7:]
                        elif line.startswith("data: "):
                            return kind, json.loads(line[6:])
                    raise AssertionError("stream ended")

                assert await asyncio.wait_for(next_event(), 20) == ("mode", {"live": True})
                job_id = await scheduler.schedule(
                    dashboard_tasks.echo, execution_time=now(), args=(1,)
                )
                seen: set[str] = set()
                while "completed" not in seen:
                    kind, data = await asyncio.wait_for(next_event(), 20)
                    assert kind == "change"
                    if job_id in data["jobs"]:
                        seen |= set(data["kinds"])
    finally:
        await app.state.dashboard.close()


async def test_bad_sources_and_tokens_fail_at_the_call(pool):
    with pytest.raises(TypeError):
        dashboard_app(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        dashboard_app(pool, token="")
    with pytest.raises(ValueError):
        dashboard_app(pool, poll_seconds=0)
    with pytest.raises(ValueError):
        dashboard_app(pool, schema="")


async def test_the_command_serves_the_dashboard(dsn, pool):
    import os
    import subprocess
    import sys

    from tests.support.dashboard_support import free_port

    await add_jobs(pool, 3)
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "pg_scheduler.cli", "dashboard", "--dsn", dsn, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PG_SCHEDULER_DASHBOARD_TOKEN": ""},
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

            async def up() -> bool:
                try:
                    return (await http.get("/api/overview")).status_code == 200
                except httpx.HTTPError:
                    return False

            await wait_until(up, timeout=30, message="the dashboard command to serve")
            assert (await http.get("/api/overview")).json()["counts"]["pending"] == 3
            refused = await http.post("/api/action/cancel", json={"job_id": "x"})
            assert refused.status_code == 403
    finally:
        proc.terminate()
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert b"read-only" in out, (out, err)


async def test_without_listen_the_stream_tells_the_page_to_poll(pool):
    # Behind pgbouncer without a direct LISTEN connection there are no events.
    app = dashboard_app(pool, pgbouncer=True)
    try:
        async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            response = await http.get("/api/stream")
            assert response.text == 'event: mode\ndata: {"live": false}\n\n'
            assert (await http.get("/api/config")).json()["read_only"] is True
    finally:
        await app.state.dashboard.close()


async def test_queues_page_shows_global_limits_and_pauses_through_the_queue_store(
    client, pool, make_scheduler
):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    await scheduler.configure_queue("reports", max_running=3, rate_limit="100/m")
    data = (await client.get("/api/queues")).json()
    by_name = {q["queue"]: q for q in data["queues"]}
    assert by_name["reports"]["settings"] == {"max_running": 3, "rate_limit": "100/m"}
    bad = await client.post(
        "/api/action/pause", json={"queue": "no spaces"}, headers={"X-Dashboard-Token": TOKEN}
    )
    assert bad.status_code == 400
    paused = await client.post(
        "/api/action/pause", json={"queue": "reports"}, headers={"X-Dashboard-Token": TOKEN}
    )
    assert paused.status_code == 200
    assert await pool.fetchval("SELECT paused FROM scheduler_queues WHERE name = 'reports'")
    assert (
        await pool.fetchval("SELECT count(*) FROM scheduler_queues WHERE name = 'no spaces'") == 0
    )


async def fake_worker(pool, *tasks: str) -> None:
    """A live worker's row listing ``tasks`` (nothing claims: no process behind it)."""
    await pool.execute(
        "INSERT INTO scheduler_workers (worker_id, hostname, pid, max_concurrent, tasks) "
        "VALUES ('w-' || md5(random()::text), 'host', 1, 4, $1::text[])",
        list(tasks),
    )


async def due_job(pool, job_id: str, task: str, minutes_ago: float) -> None:
    await pool.execute(
        "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time) "
        "VALUES ($1, $2, $2, now() - make_interval(mins => $3))",
        job_id,
        task,
        minutes_ago,
    )


async def test_overview_flags_orphans_and_leaves_them_out_of_the_oldest_wait(client, pool):
    await fake_worker(pool, "dash.echo", "dash.echo")
    await due_job(pool, "served-1", "dash.echo", 10)
    await due_job(pool, "ghost-1", "ghost.task", 120)
    await due_job(pool, "ghost-2", "ghost.task", 60)
    await pool.execute(
        "INSERT INTO periodic_jobs (dedup_key, job_name, task_name, schedule, next_run) "
        "VALUES ('gone', 'gone_report', 'periodic:gone', 'every 60s', now())"
    )
    data = (await client.get("/api/overview")).json()
    assert data["due"] == 3
    # The served job's ten minutes, not the orphan's two hours.
    assert 590 <= data["oldest_due_seconds"] < 700
    orphans = data["orphans"]
    assert orphans["due"] == 2
    assert [(j["task_name"], j["queue"], j["due"]) for j in orphans["jobs"]] == [
        ("ghost.task", "default", 2)
    ]
    assert 7190 <= orphans["oldest_due_seconds"] < 7300
    assert [p["dedup_key"] for p in orphans["periodic"]] == ["gone"]


async def test_overview_without_orphans_and_without_due_work(client, readonly, pool):
    empty = (await readonly.get("/api/overview")).json()
    assert empty["oldest_due_seconds"] is None
    assert empty["orphans"] == {"jobs": [], "due": 0, "oldest_due_seconds": None, "periodic": []}
    await fake_worker(pool, "dash.echo")
    await due_job(pool, "served-1", "dash.echo", 5)
    data = (await client.get("/api/overview")).json()
    assert data["orphans"]["jobs"] == [] and data["orphans"]["due"] == 0
    assert 290 <= data["oldest_due_seconds"] < 400


async def test_workers_list_each_task_once(client, pool):
    await fake_worker(pool, "dash.echo", "dash.boom", "dash.echo", "dash.boom", "dash.echo")
    (worker,) = (await client.get("/api/workers")).json()["workers"]
    assert worker["tasks"] == ["dash.echo", "dash.boom"]
