"""Named queues: routing, worker pools, pause/resume, validation, wake-ups, and
claims that do not read rows they cannot run."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from pg_scheduler import JobSpec, PollingConfig, Scheduler, periodic, task
from pg_scheduler.periodic.registry import PeriodicJobConfig
from pg_scheduler.store.migrate import migrate
from tests.integration.test_migrations import LEGACY_SCHEMA
from tests.support import queue_tasks
from tests.support.common import wait_for_status, wait_until, with_database


def now() -> datetime:
    return datetime.now(UTC)


async def queue_of(pool: asyncpg.Pool, job_id: str) -> str:
    return await pool.fetchval("SELECT queue FROM scheduled_jobs WHERE job_id = $1", job_id)


# -- naming a queue ----------------------------------------------------------------


async def test_explicit_queue_beats_the_tasks_which_beats_default(pool):
    producer = Scheduler(pool)  # never started
    later = now() + timedelta(hours=1)
    by_task = await producer.schedule(queue_tasks.send_email, execution_time=later, args=("a",))
    explicit = await producer.schedule(
        queue_tasks.send_email, execution_time=later, args=("b",), queue="urgent"
    )
    plain = await producer.schedule(queue_tasks.plain, execution_time=later, args=("c",))
    assert await queue_of(pool, by_task) == "emails"
    assert await queue_of(pool, explicit) == "urgent"
    assert await queue_of(pool, plain) == "default"

    ids = await producer.schedule_bulk(
        [
            JobSpec(queue_tasks.send_email, later, args=("d",)),
            JobSpec(queue_tasks.send_email, later, args=("e",), queue="bulk"),
            JobSpec(queue_tasks.plain, later, args=("f",)),
        ],
        positional=True,
    )
    assert [await queue_of(pool, i) for i in ids] == ["emails", "bulk", "default"]

    # 0.2.x's low-level insert: the registered task's queue, or the argument.
    by_name = await producer.schedule_job("q.email", later, {"args": ["g"]})
    named = await producer.schedule_job("q.email", later, {"args": ["h"]}, queue="other")
    unknown = await producer.schedule_job("nobody.here", later, {"args": []})
    assert await queue_of(pool, by_name) == "emails"
    assert await queue_of(pool, named) == "other"
    assert await queue_of(pool, unknown) == "default"


@pytest.mark.parametrize(
    ("queue", "error"),
    [
        ("", ValueError),
        ("has space", ValueError),
        ("-leading-dash", ValueError),
        ("x" * 64, ValueError),
        ("quote'd", ValueError),
        ("nul\x00", ValueError),
        (42, TypeError),
        (b"bytes", TypeError),
    ],
)
async def test_bad_queue_names_raise_and_write_nothing(pool, queue, error):
    producer = Scheduler(pool)
    later = now() + timedelta(hours=1)
    with pytest.raises(error, match="queue"):
        await producer.schedule(queue_tasks.plain, execution_time=later, args=("x",), queue=queue)
    with pytest.raises(error, match="queue"):
        JobSpec(queue_tasks.plain, later, queue=queue)
    spec = JobSpec(queue_tasks.plain, later, ("x",))
    spec.queue = queue  # changed after it was built: schedule_bulk checks again
    with pytest.raises(error, match="queue"):
        await producer.schedule_bulk([JobSpec(queue_tasks.plain, later, ("x",)), spec])
    with pytest.raises(error, match="queue"):
        await producer.schedule_job("q.plain", later, {"args": ["x"]}, queue=queue)
    with pytest.raises(error, match="queue"):
        task(queue=queue)(queue_tasks.plain)
    with pytest.raises(error, match="queue"):
        periodic(every=timedelta(minutes=1), queue=queue)(queue_tasks_periodic)
    with pytest.raises(error, match="queue"):
        await producer.pause_queue(queue)
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0
    assert await pool.fetchval("SELECT count(*) FROM scheduler_queues") == 0


async def queue_tasks_periodic() -> None:
    return None


@pytest.mark.parametrize(
    ("queues", "error", "match"),
    [
        ("emails", TypeError, "not a str"),
        ([], ValueError, "at least one"),
        ({}, ValueError, "at least one"),
        ({"emails": 0}, ValueError, ">= 1"),
        ({"emails": 2.5}, TypeError, "must be an int"),
        ({"emails": True}, TypeError, "must be an int"),
        ({"emails": 20, "reports": 10}, ValueError, "max_concurrent_jobs=25"),
        (["ok", "bad name"], ValueError, "queues entry"),
        ({"bad name": 1}, ValueError, "queues key"),
        (42, TypeError, "queues must be"),
    ],
)
def test_bad_worker_queues_raise_at_construction(pool, queues, error, match):
    with pytest.raises(error, match=match):
        Scheduler(pool, queues=queues)


def test_periodic_jobs_take_a_queue(pool):
    config = PeriodicJobConfig(queue_tasks_periodic, timedelta(minutes=5), queue="reports")
    scheduler = Scheduler(pool)
    row = scheduler.periodic.new_row(config, "p-1", now(), None)
    assert row.queue == "reports"
    default = PeriodicJobConfig(queue_tasks_periodic, timedelta(minutes=5))
    assert scheduler.periodic.new_row(default, "p-2", now(), None).queue == "default"


# -- workers serve their queues ----------------------------------------------------------


async def test_a_worker_runs_only_the_queues_it_serves(pool, make_scheduler):
    worker = await make_scheduler(queues=["emails"])
    report = await worker.schedule(queue_tasks.build_report, execution_time=now(), args=("r1",))
    # Not started in-process either: this worker does not serve "reports".
    assert (
        await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", report)
        == "pending"
    )
    emails = [
        await worker.schedule(queue_tasks.send_email, execution_time=now(), args=(f"e{n}",))
        for n in range(5)
    ]
    for job_id in emails:
        await wait_for_status(pool, job_id, "completed")
    # The report was due before the e-mails and is still pending.
    assert (
        await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", report)
        == "pending"
    )
    other = await make_scheduler(queues=["reports"])
    await wait_for_status(pool, report, "completed")
    assert (await other.get_job(report)).worker_id == other.worker_id


async def test_local_concurrency_per_queue_is_respected(pool, make_scheduler):
    for key in ("emails", "reports"):
        queue_tasks.peak[key] = 0
    await make_scheduler(max_concurrent_jobs=10, queues={"emails": 2, "reports": 3})
    producer = Scheduler(pool)
    specs = [JobSpec(queue_tasks.send_email, now(), args=(f"e{n}", 0.05)) for n in range(20)]
    specs += [JobSpec(queue_tasks.build_report, now(), args=(f"r{n}", 0.05)) for n in range(20)]
    await producer.schedule_bulk(specs)

    async def done() -> bool:
        return (
            await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'")
            == 40
        )

    await wait_until(done, timeout=30, message="all 40 jobs")
    assert queue_tasks.peak["emails"] == 2
    assert queue_tasks.peak["reports"] == 3


# -- pause and resume ----------------------------------------------------------------------


async def test_pause_stops_claims_and_resume_restarts_them(pool, make_scheduler):
    worker = await make_scheduler()
    await worker.pause_queue("emails")
    paused = await worker.schedule(queue_tasks.send_email, execution_time=now(), args=("p",))
    # Scheduling into a paused queue works; the in-process start leaves it pending.
    assert (
        await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", paused)
        == "pending"
    )
    # A later job of another queue runs: the worker claimed past the paused one.
    barrier = await worker.schedule(
        queue_tasks.plain, execution_time=now() + timedelta(milliseconds=100), args=("b",)
    )
    await wait_for_status(pool, barrier, "completed")
    assert (
        await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", paused)
        == "pending"
    )
    listed = {q["name"]: q for q in await worker.list_queues()}
    assert listed["emails"]["paused"] is True
    assert (listed["emails"]["pending"], listed["emails"]["due"]) == (1, 1)
    assert "default" not in listed  # no row, no pending or running job: not listed

    await worker.resume_queue("emails")
    await wait_for_status(pool, paused, "completed", timeout=5)
    assert {q["name"]: q["paused"] for q in await worker.list_queues()}["emails"] is False


async def test_running_jobs_finish_when_their_queue_is_paused(pool, make_scheduler):
    worker = await make_scheduler(max_concurrent_jobs=1, batch_claim_limit=1)
    first = await worker.schedule(queue_tasks.send_email, execution_time=now(), args=("1", 0.5))
    await wait_for_status(pool, first, "running")
    second = await worker.schedule(queue_tasks.send_email, execution_time=now(), args=("2",))
    await worker.pause_queue("emails")
    await wait_for_status(pool, first, "completed")
    barrier = await worker.schedule(queue_tasks.plain, execution_time=now(), args=("b",))
    await wait_for_status(pool, barrier, "completed")
    assert (
        await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", second)
        == "pending"
    )
    await worker.resume_queue("emails")
    await wait_for_status(pool, second, "completed")


# -- wake-ups ----------------------------------------------------------------------------


async def test_inserts_notify_the_queues_of_their_rows(pool):
    conn = await asyncpg.connect(_dsn_of(pool))
    heard: asyncio.Queue[str] = asyncio.Queue()
    await conn.add_listener("pg_scheduler_jobs", lambda *a: heard.put_nowait(a[3]))
    try:
        producer = Scheduler(pool)
        later = now() + timedelta(hours=1)
        await producer.schedule_bulk(
            [
                JobSpec(queue_tasks.send_email, later, ("k",)),
                JobSpec(queue_tasks.build_report, later, ("k",)),
            ]
            * 3
        )
        await producer.schedule(queue_tasks.plain, execution_time=later, args=("k",))
        got = {await asyncio.wait_for(heard.get(), 5) for _ in range(3)}
        assert got == {"emails", "reports", ""}  # "default" sends '', as 0.2.x did
    finally:
        await conn.close()


def _dsn_of(pool: asyncpg.Pool) -> str:
    params = pool._connect_kwargs  # the fixture's pool: built from a DSN
    return params.get("dsn") or pool._connect_args[0]


async def test_a_worker_wakes_only_for_queues_it_serves(pool):
    scheduler = Scheduler(pool, queues=["emails"])
    woken: list[int] = []
    scheduler.worker.wake = lambda: woken.append(1)  # type: ignore[method-assign]
    scheduler._channels.on_jobs("reports")
    assert woken == []
    scheduler._channels.on_jobs("")  # the "default" queue
    assert woken == []
    scheduler._channels.on_jobs("emails")
    scheduler._channels.on_jobs("*")  # hand-backs, rescues, retries: everyone
    assert len(woken) == 2
    default = Scheduler(pool, queues=["default"])
    default.worker.wake = lambda: woken.append(1)  # type: ignore[method-assign]
    default._channels.on_jobs("")
    assert len(woken) == 3
    woken.clear()
    everyone = Scheduler(pool)
    everyone.worker.wake = lambda: woken.append(1)  # type: ignore[method-assign]
    everyone._channels.on_jobs("reports")
    assert len(woken) == 1


# -- the claim reads only what it can run -----------------------------------------------


async def _claim_buffers(pool: asyncpg.Pool, sql: str, *args: object) -> int:
    async with pool.acquire() as conn:
        tr = conn.transaction()
        await tr.start()
        try:
            plan = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *args)
        finally:
            await tr.rollback()
    top = json.loads(plan)[0]["Plan"]
    return top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)


@pytest.mark.parametrize("backlog", ["foreign queue", "unregistered task"])
async def test_a_due_backlog_the_worker_cannot_run_costs_its_claim_nothing(pool, backlog):
    queue, task_name = (
        ("elsewhere", "q.plain")
        if backlog == "foreign queue"
        else (
            "default",
            "nobody.runs.this",
        )
    )
    scheduler = Scheduler(pool, queues=["default"])
    store = scheduler.store
    await pool.execute(
        "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, queue)"
        " SELECT 'bg-' || n, 'x', $1, now() - interval '1 hour', $2"
        " FROM generate_series(1, 20000) n",
        task_name,
        queue,
    )
    await pool.execute(
        "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time)"
        " SELECT 'mine-' || n, 'plain', 'q.plain', now() FROM generate_series(1, 50) n"
    )
    await pool.execute("ANALYZE scheduled_jobs")
    args = (["q.plain"], 10, "w-explain", 30.0, 10, ["default"], None)
    buffers = await _claim_buffers(pool, store._claim, *args)
    # The 20,000 rows would be hundreds of pages; the claim reads a few dozen
    # (plus each claimed row's new entries in every full index of the table).
    assert buffers < 170, buffers
    due = await _claim_buffers(pool, store._next_due, ["q.plain"], ["default"])
    assert due < 60, due
    claimed = await store.claim("w-explain", ["q.plain"], 10, 30.0, queues=["default"])
    assert len(claimed) == 10 and {r["task_name"] for r in claimed} == {"q.plain"}


# -- a 0.2.x table --------------------------------------------------------------------------


async def test_a_migrated_023_table_lands_in_default(server_dsn):
    name = f"pgs_q023_{uuid4_hex()}"
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    dsn = with_database(server_dsn, name)
    try:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(LEGACY_SCHEMA)
            await conn.execute(
                "INSERT INTO scheduled_jobs (job_id, job_name, execution_time, task_data)"
                " VALUES ('legacy-q', 'q.plain', now() - interval '1 second',"
                ' \'{"args": ["legacy"], "kwargs": {}}\')'
            )
            await migrate(conn)
            assert (
                await conn.fetchval("SELECT queue FROM scheduled_jobs WHERE job_id = 'legacy-q'")
                == "default"
            )
        finally:
            await conn.close()
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=5)
        try:
            scheduler = Scheduler(pool, queues=["default"], vacuum_enabled=False)
            await scheduler.start()
            try:
                await wait_for_status(pool, "legacy-q", "completed")
            finally:
                await scheduler.shutdown(grace_period=1.0)
        finally:
            await pool.close()
    finally:
        admin = await asyncpg.connect(server_dsn)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def uuid4_hex() -> str:
    import uuid

    return uuid.uuid4().hex[:8]


_ = PollingConfig  # imported for readers: workers here use the default polling


# -- operators see queues ------------------------------------------------------------------


async def test_stats_status_and_metrics_show_queues(pool, capsys):
    from pg_scheduler.cli.reports import render_status
    from pg_scheduler.observe.stats import collect_stats

    producer = Scheduler(pool)
    await producer.schedule(queue_tasks.send_email, execution_time=now(), args=("s1",))
    await producer.schedule(
        queue_tasks.build_report, execution_time=now() + timedelta(hours=1), args=("s2",)
    )
    await producer.pause_queue("reports")
    stats = await producer.stats()
    by_queue = {q.queue: q for q in stats.by_queue}
    assert (by_queue["emails"].pending, by_queue["emails"].due) == (1, 1)
    assert by_queue["emails"].paused is False
    assert (by_queue["reports"].pending, by_queue["reports"].due) == (1, 0)
    assert by_queue["reports"].paused is True
    render_status(await collect_stats(pool))
    out = capsys.readouterr().out
    assert "Queues" in out and "PAUSED" in out


async def test_prometheus_gauges_per_queue(pool):
    pytest.importorskip("prometheus_client")
    from pg_scheduler.observe.metrics import MetricsExporter
    from tests.integration.test_stats_metrics import scrape

    producer = Scheduler(pool)
    await producer.schedule(queue_tasks.send_email, execution_time=now(), args=("m1",))
    await producer.pause_queue("emails")
    async with MetricsExporter(pool, port=0, addr="127.0.0.1") as exporter:
        text = await asyncio.to_thread(scrape, exporter.port)
    assert 'pg_scheduler_queue_jobs{queue="emails",state="due"} 1.0' in text
    assert 'pg_scheduler_queue_paused{queue="emails"} 1.0' in text


async def test_events_carry_the_jobs_queue_and_filter_on_it(pool, make_scheduler):
    worker = await make_scheduler()
    async with worker.events(["completed"], queue="emails") as emails:
        plain = await worker.schedule(queue_tasks.plain, execution_time=now(), args=("ev0",))
        await wait_for_status(pool, plain, "completed")
        job_id = await worker.schedule(queue_tasks.send_email, execution_time=now(), args=("ev",))
        event = await asyncio.wait_for(emails.__anext__(), 10)
    # The plain job's event was filtered out: the first one seen is the e-mail's.
    assert (event.job_id, event.queue, event.kind) == (job_id, "emails", "completed")


async def test_current_job_names_the_jobs_queue(pool, make_scheduler):
    worker = await make_scheduler()
    ids = [
        await worker.schedule(queue_tasks.own_queue, execution_time=now()),
        await worker.schedule(queue_tasks.own_queue, execution_time=now(), queue="urgent"),
        await worker.schedule(queue_tasks.own_queue, execution_time=now(), queue="default"),
    ]
    seen = []
    for job_id in ids:
        await wait_for_status(pool, job_id, "completed")
        result = await pool.fetchval("SELECT result FROM scheduled_jobs WHERE job_id = $1", job_id)
        seen.append(json.loads(result))
    assert seen == ["reports", "urgent", "default"]
