"""Priority orders limited and unlimited work together: a limited job whose
limit has room starts ahead of less urgent unlimited backlog, a full limit
holds back only its own group, and limits stay exact meanwhile."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg

from pg_scheduler import JobPriority, JobSpec, Scheduler
from tests.support import limited_priority_tasks as lp
from tests.support.common import start_cli_worker, wait_until
from tests.support.spans import max_overlap

CRITICAL = JobPriority.CRITICAL


async def _tables(pool) -> None:
    await pool.execute(
        "CREATE TABLE IF NOT EXISTS lp_runs"
        " (kind text, n int, pid int, started float8, ended float8)"
    )
    await pool.execute("TRUNCATE lp_runs")


async def _finished(pool, total: int) -> None:
    async def done() -> bool:
        left = await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE status <> 'completed'"
        )
        return left == 0 and await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == total

    await wait_until(done, timeout=100, interval=0.2, message=f"{total} jobs completed")


async def _sample_running(pool, task: str, into: list[int], stop: asyncio.Event) -> None:
    # How many ``task`` jobs the table shows running, as often as it answers.
    async with pool.acquire() as conn:
        while not stop.is_set():
            into.append(
                await conn.fetchval(
                    "SELECT count(*) FROM scheduled_jobs"
                    " WHERE task_name = $1 AND status = 'running'",
                    task,
                )
            )
            await asyncio.sleep(0.002)


async def _workers_and_limit(pool, task: str) -> None:
    # Both worker processes registered and ``task``'s limit row written.
    async def ready() -> bool:
        workers_up = await pool.fetchval("SELECT count(*) FROM scheduler_workers")
        limit = await pool.fetchval("SELECT count(*) FROM scheduler_limits WHERE name = $1", task)
        return workers_up >= 2 and limit == 1

    await wait_until(ready, timeout=60, interval=0.1, message=f"2 workers and {task}'s limit")


async def _started_after(pool, task: str) -> int:
    """Unlimited jobs that started after the last job of ``task`` did."""
    return await pool.fetchval(
        """SELECT count(*) FROM scheduled_jobs
            WHERE task_name = 'lp.plain'
              AND started_at > (SELECT max(started_at) FROM scheduled_jobs
                                 WHERE task_name = $1)""",
        task,
    )


async def test_limited_critical_jobs_start_ahead_of_an_unlimited_backlog(pool, dsn):
    # Two worker processes; 3,000 unlimited NORMAL jobs enqueued in the same
    # statement as rate-limited and max_running-limited CRITICAL jobs. The
    # limited ones must not wait for the backlog: each limited task's last
    # start comes before at least a third of the backlog has started.
    backlog = 3000
    await _tables(pool)
    setter = Scheduler(pool, run_periodic_jobs=False)
    await setter.initialize_db()
    await setter.configure_task("lp.rated", rate_limit="100/s")
    workers = [
        await start_cli_worker(dsn, "tests.support.limited_priority_tasks:SETTINGS")
        for _ in range(2)
    ]
    sampled: list[int] = []
    stop_sampling = asyncio.Event()

    try:
        await _workers_and_limit(pool, "lp.capped")
        sampler = asyncio.create_task(_sample_running(pool, "lp.capped", sampled, stop_sampling))
        now = datetime.now(UTC)
        specs = [JobSpec(lp.rated, now, args=(n,), priority=CRITICAL) for n in range(10)]
        specs += [JobSpec(lp.capped, now, args=(n,), priority=CRITICAL) for n in range(10)]
        specs += [JobSpec(lp.plain, now, args=(n,)) for n in range(backlog)]
        await setter.schedule_bulk(specs, batch_size=len(specs))
        await _finished(pool, len(specs))
        stop_sampling.set()
        await sampler
    finally:
        stop_sampling.set()
        for w in workers:
            w.terminate()
        for w in workers:
            await asyncio.wait_for(w.wait(), 30)

    after_rated = await _started_after(pool, "lp.rated")
    after_capped = await _started_after(pool, "lp.capped")
    assert after_rated >= backlog // 3, f"only {after_rated} of {backlog} started after lp.rated"
    assert after_capped >= backlog // 3, f"only {after_capped} of {backlog} started after lp.capped"
    # The limit held while the two kinds of work interleaved.
    runs = await pool.fetch("SELECT * FROM lp_runs WHERE kind = 'capped'")
    assert len(runs) == 10
    assert max_overlap([(r["started"], r["ended"]) for r in runs]) <= 2
    assert sampled and max(sampled) <= 2
    assert len(await pool.fetch("SELECT n FROM lp_runs WHERE kind = 'rated'")) == 10


async def test_a_full_limit_holds_back_only_its_own_group(pool, make_scheduler, dsn, monkeypatch):
    # CRITICAL jobs of a task at its max_running and of a task whose rate
    # window is used up are due; the unlimited NORMAL work drains all the same.
    await _tables(pool)
    lp.OPEN.clear()
    monkeypatch.setenv("PG_SCHEDULER_DSN", dsn)
    worker = await make_scheduler(max_concurrent_jobs=5, batch_claim_limit=5)
    await worker.configure_task("lp.rated", rate_limit="2/m")
    now = datetime.now(UTC)
    specs = [JobSpec(lp.gate, now, args=(n,), priority=CRITICAL) for n in range(3)]
    specs += [JobSpec(lp.rated, now, args=(n,), priority=CRITICAL) for n in range(6)]
    specs += [JobSpec(lp.plain, now, args=(n,)) for n in range(300)]
    await worker.schedule_bulk(specs, batch_size=len(specs))

    async def status_count(task: str, status: str) -> int:
        return await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE task_name = $1 AND status = $2",
            task,
            status,
        )

    async def plain_done() -> bool:
        return await status_count("lp.plain", "completed") == 300

    await wait_until(plain_done, timeout=60, interval=0.1, message="the unlimited jobs")

    async def limits_used() -> bool:
        return (
            await status_count("lp.gate", "running") == 1
            and await status_count("lp.rated", "completed") == 2
        )

    await wait_until(limits_used, timeout=30, interval=0.1, message="both limits used up")
    assert await status_count("lp.gate", "pending") == 2
    assert await status_count("lp.rated", "pending") == 4
    for n in range(3):
        lp.OPEN.setdefault(n, asyncio.Event()).set()

    async def gates_done() -> bool:
        return await status_count("lp.gate", "completed") == 3

    await wait_until(gates_done, timeout=30, interval=0.1, message="the gated jobs")


async def test_urgent_unlimited_work_starts_before_less_urgent_limited_work(
    pool, make_scheduler, dsn, monkeypatch
):
    # The other way round: limited NORMAL jobs with room wait for the due
    # unlimited CRITICAL ones.
    await _tables(pool)
    monkeypatch.setenv("PG_SCHEDULER_DSN", dsn)
    worker = await make_scheduler(start=False, max_concurrent_jobs=4, batch_claim_limit=4)
    await worker.initialize_db()
    await worker.configure_task("lp.rated", rate_limit="1000/s")
    now = datetime.now(UTC)
    specs = [JobSpec(lp.rated, now, args=(n,)) for n in range(20)]
    specs += [JobSpec(lp.plain, now, args=(n,), priority=CRITICAL) for n in range(200)]
    await worker.schedule_bulk(specs, batch_size=len(specs))
    await worker.start()
    await _finished(pool, len(specs))
    last_critical = await pool.fetchval(
        "SELECT max(started_at) FROM scheduled_jobs WHERE task_name = 'lp.plain'"
    )
    first_limited = await pool.fetchval(
        "SELECT min(started_at) FROM scheduled_jobs WHERE task_name = 'lp.rated'"
    )
    assert last_critical <= first_limited


async def test_a_limit_holds_across_a_worker_killed_mid_job(pool, dsn):
    # lp.held (max_running=1) CRITICAL jobs interleave with an unlimited
    # backlog on two worker processes; the one running lp.held is killed -9.
    # Its job keeps the limit's one place until its lease is given up: no
    # other lp.held job runs meanwhile, then the rescued job and the rest run.
    await _tables(pool)
    setter = Scheduler(pool, run_periodic_jobs=False)
    await setter.initialize_db()
    workers = [
        await start_cli_worker(dsn, "tests.support.limited_priority_tasks:FAST_RESCUE")
        for _ in range(2)
    ]
    sampled: list[int] = []
    stop_sampling = asyncio.Event()

    try:
        await _workers_and_limit(pool, "lp.held")
        sampler = asyncio.create_task(_sample_running(pool, "lp.held", sampled, stop_sampling))
        now = datetime.now(UTC)
        specs = [JobSpec(lp.held, now, args=(n,), priority=CRITICAL) for n in range(3)]
        specs += [JobSpec(lp.plain, now, args=(n,)) for n in range(2000)]
        await setter.schedule_bulk(specs, batch_size=len(specs))

        async def held_running() -> asyncpg.Record | None:
            return await pool.fetchrow(
                """SELECT w.pid, extract(epoch FROM j.started_at)::float8 AS claimed
                     FROM scheduled_jobs j
                     JOIN scheduler_workers w ON w.worker_id = j.worker_id
                    WHERE j.task_name = 'lp.held' AND j.status = 'running'"""
            )

        await wait_until(held_running, timeout=60, message="an lp.held job running")
        running = await held_running()
        victim = next(w for w in workers if w.pid == running["pid"])
        victim.kill()
        await victim.wait()
        killed_at = await pool.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
        await _finished(pool, len(specs))
        stop_sampling.set()
        await sampler
    finally:
        stop_sampling.set()
        for w in workers:
            if w.returncode is None:
                w.terminate()
        for w in workers:
            await asyncio.wait_for(w.wait(), 30)

    assert sampled and max(sampled) <= 1
    runs = await pool.fetch("SELECT * FROM lp_runs WHERE kind = 'held'")
    assert sorted(r["n"] for r in runs) == [0, 1, 2]  # the killed run never recorded
    assert max_overlap([(r["started"], r["ended"]) for r in runs]) <= 1
    # The killed worker's lp.held job held the limit's place until the
    # rescuer gave it back (the heartbeat threshold is 2 s): no run started
    # after its claim started before then.
    later = [r["started"] for r in runs if r["started"] > running["claimed"]]
    assert later and min(later) >= killed_at + 1.0
    rescued = await pool.fetchval(
        "SELECT count(*) FROM scheduled_jobs WHERE task_name = 'lp.held' AND attempts > 1"
    )
    assert rescued == 1
