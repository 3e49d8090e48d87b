"""Declared dependencies (``depends_on=``, migration 0015): a job waits, outside
the claim index, until its last dependency completes; it becomes pending in
that completion's transaction and its workers are woken by NOTIFY; a
dependency that ends otherwise applies the dependent's policy; bad graphs
are refused at the call and write nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from pg_scheduler import (
    ConflictResolution,
    JobSpec,
    RetryPolicy,
    Scheduler,
    SyncClient,
    chain,
    chord,
    current_job,
    group,
    task,
)
from pg_scheduler.store import Completion, Store
from pg_scheduler.store.housekeeping import OpsStore
from tests.support import dependency_tasks as t
from tests.support.common import job_status, wait_for_status, wait_until


@pytest.fixture(autouse=True)
async def runs_table(pool: asyncpg.Pool) -> None:
    await t.fresh_runs(pool)


def now() -> datetime:
    return datetime.now(UTC)


def later() -> datetime:
    return now() + timedelta(hours=1)


async def row(pool: asyncpg.Pool, job_id: str) -> asyncpg.Record:
    return await pool.fetchrow(
        "SELECT status, wait_kind, dependencies_unmet, has_dependents, error_message,"
        " execution_time FROM scheduled_jobs WHERE job_id = $1",
        job_id,
    )


async def runs(pool: asyncpg.Pool) -> dict[str, asyncpg.Record]:
    """name -> its (only) run."""
    records = await pool.fetch("SELECT * FROM dep_runs ORDER BY run_id")
    return {r["name"]: r for r in records}


async def all_final(pool: asyncpg.Pool, ids: list[str]) -> None:
    async def final() -> bool:
        statuses = await pool.fetch(
            "SELECT status FROM scheduled_jobs WHERE job_id = ANY($1::text[])", ids
        )
        return len(statuses) == len(ids) and all(
            s["status"] in ("completed", "failed", "cancelled", "expired") for s in statuses
        )

    await wait_until(final, timeout=15, message=f"{len(ids)} jobs to end")


async def count_rows(pool: asyncpg.Pool) -> tuple[int, int]:
    jobs = await pool.fetchval("SELECT count(*) FROM scheduled_jobs")
    edges = await pool.fetchval("SELECT count(*) FROM job_dependencies")
    return jobs, edges


# -- the order and the claim ---------------------------------------------------------


async def test_a_chain_runs_each_job_after_the_one_before_completed(pool, make_scheduler):
    scheduler = await make_scheduler()
    a = await scheduler.schedule(t.step, execution_time=now(), args=("a",))
    b = await scheduler.schedule(t.step, execution_time=now(), args=("b",), depends_on=[a])
    c = await scheduler.schedule(t.collect, execution_time=now(), args=("c",), depends_on=[b, a])
    await all_final(pool, [a, b, c])
    done = await runs(pool)
    assert done["a"]["ended_at"] <= done["b"]["started_at"]
    assert done["b"]["ended_at"] <= done["c"]["started_at"]
    assert await scheduler.result(c) == [[b, "b"], [a, "a"]]  # declared order
    finished = {
        r["job_id"]: r["finished_at"]
        for r in await pool.fetch("SELECT job_id, finished_at FROM scheduled_jobs")
    }
    assert finished[a] <= done["b"]["started_at"] and finished[b] <= done["c"]["started_at"]


async def test_a_waiting_job_is_outside_the_claim_index_and_never_claimed(pool, make_scheduler):
    scheduler = await make_scheduler()
    first = await scheduler.schedule(t.step, execution_time=later(), args=("first",))
    then = await scheduler.schedule(
        t.step, execution_time=now(), args=("then",), depends_on=[first]
    )
    got = await row(pool, then)
    assert (got["status"], got["wait_kind"], got["dependencies_unmet"]) == (
        "waiting",
        "dependencies",
        1,
    )
    assert (await row(pool, first))["has_dependents"]
    predicate = await pool.fetchval(
        "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i"
        " WHERE i.indexrelid = 'scheduled_jobs_claim_idx'::regclass"
    )
    # 0017 and 0018 leave rows with a concurrency or fair share key out; a
    # waiting row is in neither case.
    assert predicate == (
        "((status = 'pending'::text) AND (concurrency_key IS NULL) AND (fair_share_key IS NULL))"
    )
    # A due plain job runs past it; the waiting one is never taken.
    plain = await scheduler.schedule(t.step, execution_time=now(), args=("plain",))
    await wait_for_status(pool, plain, "completed")
    assert await job_status(pool, then) == "waiting"
    assert "then" not in await runs(pool)


async def test_the_dependent_is_pending_in_the_completion_transaction_and_wakes_workers(pool, dsn):
    """No worker: the store's own completion statement, in a transaction held
    open. Before its commit no other session sees the dependent pending; at
    the commit it is pending and its queue's channel is notified."""
    store = Store(pool)
    producer = Scheduler(pool)  # never started: it only enqueues
    first = await producer.schedule(t.step, execution_time=now(), args=("first",))
    then = await producer.schedule(
        t.step, execution_time=now(), args=("then",), depends_on=[first], queue="reports"
    )
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'running', worker_id = 'w1', attempts = 1,"
        " started_at = now() WHERE job_id = $1",
        first,
    )
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(dsn)
    await listener.add_listener("pg_scheduler_jobs", lambda *args: heard.put_nowait(args[3]))
    try:
        async with pool.acquire() as conn, conn.transaction():
            written = await store.complete("w1", [Completion(first, 1, '"out"')], False, conn)
            assert written == {first}
            assert await job_status(pool, then) == "waiting"  # not committed yet
            assert heard.empty()
        assert await job_status(pool, then) == "pending"
        assert await asyncio.wait_for(heard.get(), 5) == "reports"
    finally:
        await listener.close()
    got = await row(pool, then)
    assert (got["wait_kind"], got["dependencies_unmet"]) == (None, 0)
    result = await pool.fetchval(
        "SELECT result::text FROM job_dependencies WHERE job_id = $1 AND depends_on = $2",
        then,
        first,
    )
    assert result == '"out"'


@pytest.mark.parametrize(
    "how", ["complete", "complete_unlocked", "update_job_status", "earlier_version"]
)
async def test_every_statement_that_completes_a_running_job_releases_its_dependents(pool, how, dsn):
    """The completer's statement, the one it writes a batch apart with, a
    forced status (0.2.x's update_job_status), and a completion as a worker of
    an earlier version writes it (a plain UPDATE: the trigger releases);
    each in its own transaction."""
    producer = Scheduler(pool)
    firsts = [await producer.schedule(t.step, execution_time=now(), args=(n,)) for n in "ab"]
    join = await producer.schedule(t.step, execution_time=now(), args=("j",), depends_on=firsts)
    single = await producer.schedule(
        t.step, execution_time=now(), args=("s",), depends_on=firsts[:1]
    )
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'running', worker_id = 'w1', attempts = 1,"
        " started_at = now(), result = '\"stored\"'::jsonb WHERE job_id = ANY($1::text[])",
        firsts,
    )
    store = Store(pool)
    done = [Completion(firsts[0], 1, '"one"')]
    if how == "complete":
        assert await store.complete("w1", done, False) == {firsts[0]}
    elif how == "complete_unlocked":
        assert await store.complete_unlocked("w1", done, False) == ({firsts[0]}, set())
    elif how == "earlier_version":
        # On a connection of its own: one where no statement of this version
        # ever marked a transaction (the trigger must not take the unset
        # setting for a mark).
        fresh = await asyncpg.connect(dsn)
        try:
            await fresh.execute(
                "UPDATE scheduled_jobs SET status = 'completed', result = '\"one\"'::jsonb,"
                " finished_at = now() WHERE job_id = $1 AND status = 'running'",
                firsts[0],
            )
        finally:
            await fresh.close()
    else:
        assert await producer.update_job_status(firsts[0], "completed")
    assert await job_status(pool, single) == "pending"
    got = await row(pool, join)
    assert (got["status"], got["dependencies_unmet"]) == ("waiting", 1)
    expected = '"stored"' if how == "update_job_status" else '"one"'
    assert (
        await pool.fetchval("SELECT result::text FROM job_dependencies WHERE job_id = $1", single)
        == expected
    )
    assert await store.complete("w1", [Completion(firsts[1], 1, None)], False) == {firsts[1]}
    got = await row(pool, join)
    assert (got["status"], got["dependencies_unmet"], got["wait_kind"]) == ("pending", 0, None)


async def test_a_completion_finds_its_dependents_edges_by_key_not_by_a_scan(pool):
    """The release reads the edges of the jobs it completes through the primary
    key: with thousands of edges held, a completion batch does not scan
    job_dependencies (its cost would grow with every graph in the table)."""
    producer = Scheduler(pool)
    specs: list[JobSpec] = []
    for n in range(10_000):
        specs += chain(JobSpec(t.step, later(), (f"a{n}",)), JobSpec(t.step, later(), (f"b{n}",)))
    ids = await producer.schedule_bulk(specs)
    try:
        firsts = ids[0:100:2]  # a batch of 50
        await pool.execute(
            "UPDATE scheduled_jobs SET status = 'running', worker_id = 'w1', attempts = 1,"
            " started_at = now() WHERE job_id = ANY($1::text[])",
            firsts,
        )
        await pool.execute("ANALYZE job_dependencies")
        store = Store(pool)
        # This backend's reads of the table not yet reported (its earlier
        # transactions' too, until it reports them): read before and after.
        reads = (
            "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables"
            " WHERE relname = 'job_dependencies'"
        )
        async with pool.acquire() as conn, conn.transaction():
            before = await conn.fetchrow(reads)
            done = [Completion(job_id, 1, None) for job_id in firsts]
            assert await store.complete("w1", done, False, conn) == set(firsts)
            after = await conn.fetchrow(reads)
        assert after["seq_scan"] - before["seq_scan"] == 0
        assert after["idx_scan"] > before["idx_scan"]
        for second in ids[1:100:2]:
            assert await job_status(pool, second) == "pending"
    finally:
        await pool.execute("DELETE FROM scheduled_jobs WHERE job_id = ANY($1::text[])", ids)


async def test_a_join_is_released_once_by_whichever_dependency_completes_last(pool, make_scheduler):
    scheduler = await make_scheduler(max_concurrent_jobs=20, batch_claim_limit=20)
    root = JobSpec(t.step, now(), ("root",))
    middle = [JobSpec(t.step, now(), (f"m{i}",), depends_on=[root]) for i in range(30)]
    sink = JobSpec(t.collect, now(), ("sink",), depends_on=middle)
    ids = await scheduler.schedule_bulk([root, *middle, sink])
    await all_final(pool, ids)
    done = await runs(pool)
    assert len(await pool.fetch("SELECT 1 FROM dep_runs WHERE name = 'sink'")) == 1
    assert all(done[f"m{i}"]["ended_at"] <= done["sink"]["started_at"] for i in range(30))
    assert all(done["root"]["ended_at"] <= done[f"m{i}"]["started_at"] for i in range(30))
    results = await scheduler.result(ids[-1])
    assert results == [[job_id, f"m{i}"] for i, job_id in enumerate(ids[1:-1])]


async def test_dependencies_cross_queues(pool, make_scheduler):
    scheduler = await make_scheduler()
    a = await scheduler.schedule(t.step, execution_time=now(), args=("a",), queue="ingest")
    b = await scheduler.schedule(
        t.step, execution_time=now(), args=("b",), queue="reports", depends_on=[a]
    )
    await all_final(pool, [a, b])
    done = await runs(pool)
    assert done["a"]["ended_at"] <= done["b"]["started_at"]
    assert await pool.fetchval("SELECT queue FROM scheduled_jobs WHERE job_id = $1", b) == (
        "reports"
    )


async def test_a_dependency_already_completed_counts_as_met_at_insert(pool, make_scheduler):
    scheduler = await make_scheduler()
    a = await scheduler.schedule(t.step, execution_time=now(), args=("a",))
    await wait_for_status(pool, a, "completed")
    b = await scheduler.schedule(t.collect, execution_time=now(), args=("b",), depends_on=[a])
    await wait_for_status(pool, b, "completed")
    assert await scheduler.result(b) == [[a, "a"]]


async def test_a_future_dependent_keeps_its_own_time(pool, make_scheduler):
    scheduler = await make_scheduler()
    when = later()
    a = await scheduler.schedule(t.step, execution_time=now(), args=("a",))
    b = await scheduler.schedule(t.step, execution_time=when, args=("b",), depends_on=[a])
    await wait_for_status(pool, a, "completed")
    await wait_for_status(pool, b, "pending")
    assert (await row(pool, b))["execution_time"] == when


# -- a dependency that does not complete ---------------------------------------------


async def test_cancel_policy_cancels_every_job_waiting_on_the_failed_one(pool, make_scheduler):
    scheduler = await make_scheduler()
    bad = JobSpec(t.fail, now(), ("bad",))
    flow = chain(bad, JobSpec(t.step, now(), ("x",)), JobSpec(t.step, now(), ("y",)))
    other = JobSpec(t.step, now(), ("other",))
    ids = await scheduler.schedule_bulk([*flow, other])
    await all_final(pool, ids)
    statuses = [await job_status(pool, i) for i in ids]
    assert statuses == ["failed", "cancelled", "cancelled", "completed"]
    for job_id in ids[1:3]:
        assert (await row(pool, job_id))["error_message"] == (
            f"cancelled: its dependency {ids[0]} failed"
        )
    assert set(await runs(pool)) == {"bad", "other"}


async def test_run_policy_runs_the_dependent_anyway(pool, make_scheduler):
    scheduler = await make_scheduler()
    good = JobSpec(t.step, now(), ("good",))
    bad = JobSpec(t.fail, now(), ("bad",))
    after = JobSpec(
        t.collect, now(), ("after",), depends_on=[good, bad], on_dependency_failure="run"
    )
    ids = await scheduler.schedule_bulk([good, bad, after])
    await all_final(pool, ids)
    assert await scheduler.result(ids[2]) == [[ids[0], "good"], [ids[1], None]]
    done = await runs(pool)
    assert done["bad"]["ended_at"] <= done["after"]["started_at"]


async def test_wait_policy_waits_until_the_failed_one_is_retried_and_completes(
    pool, make_scheduler
):
    scheduler = await make_scheduler()
    flaky = await scheduler.schedule(t.fail, execution_time=now(), args=("flaky",))
    after = await scheduler.schedule(
        t.step,
        execution_time=now(),
        args=("after",),
        depends_on=[flaky],
        on_dependency_failure="wait",
    )
    await wait_for_status(pool, flaky, "failed")
    got = await row(pool, after)
    assert (got["status"], got["wait_kind"]) == ("waiting", "dependencies")
    # The operator fixes the cause and retries: the job runs a task that succeeds.
    await pool.execute(
        "UPDATE scheduled_jobs SET task_name = 'dep.step', job_name = 'step' WHERE job_id = $1",
        flaky,
    )
    assert await OpsStore(pool).retry([flaky]) == [flaky]
    await all_final(pool, [flaky, after])
    assert await job_status(pool, after) == "completed"


async def test_only_the_final_failure_counts_not_a_retried_attempt(pool, make_scheduler):
    scheduler = await make_scheduler()
    attempts: list[int] = []

    @task(name="dep.once_failing")
    async def once_failing() -> str:
        attempts.append(current_job().attempt)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")
        return "second"

    first = await scheduler.schedule(
        once_failing,
        execution_time=now(),
        max_retries=1,
        retry_policy=RetryPolicy(base_delay=0.05, jitter=False),
    )
    after = await scheduler.schedule(
        t.collect, execution_time=now(), args=("after",), depends_on=[first]
    )
    await all_final(pool, [first, after])
    assert attempts == [1, 2]
    assert await scheduler.result(after) == [[first, "second"]]


async def test_cancelling_a_dependency_cancels_its_dependents(pool, make_scheduler):
    scheduler = await make_scheduler()
    first = await scheduler.schedule(t.step, execution_time=later(), args=("first",))
    then = await scheduler.schedule(
        t.step, execution_time=now(), args=("then",), depends_on=[first]
    )
    keep = await scheduler.schedule(
        t.step,
        execution_time=now(),
        args=("keep",),
        depends_on=[first],
        on_dependency_failure="run",
    )
    assert await scheduler.cancel_job(first)
    assert await job_status(pool, then) == "cancelled"
    assert (await row(pool, then))["error_message"] == (
        f"cancelled: its dependency {first} was cancelled"
    )
    await wait_for_status(pool, keep, "completed")
    job = await scheduler.wait_for(then, timeout=5)
    assert job.status == "cancelled"


async def test_a_dependency_that_had_failed_applies_the_policy_at_insert(pool, make_scheduler):
    scheduler = await make_scheduler()
    bad = await scheduler.schedule(t.fail, execution_time=now(), args=("bad",))
    await wait_for_status(pool, bad, "failed")
    cancelled = await scheduler.schedule(
        t.step, execution_time=now(), args=("c",), depends_on=[bad]
    )
    assert await job_status(pool, cancelled) == "cancelled"
    ran = await scheduler.schedule(
        t.step, execution_time=now(), args=("r",), depends_on=[bad], on_dependency_failure="run"
    )
    waits = await scheduler.schedule(
        t.step, execution_time=now(), args=("w",), depends_on=[bad], on_dependency_failure="wait"
    )
    await wait_for_status(pool, ran, "completed")
    assert await job_status(pool, waits) == "waiting"


async def test_a_completion_that_deletes_its_row_still_releases_the_dependent(pool, make_scheduler):
    from pg_scheduler import VacuumConfig, VacuumPolicy, VacuumTrigger

    config = VacuumConfig(completed=VacuumPolicy(trigger=VacuumTrigger.IMMEDIATE))
    scheduler = await make_scheduler(vacuum_enabled=True, vacuum_config=config)
    # In one call: a completed row is deleted at once, and could not be named after.
    first = JobSpec(t.step, now(), ("a",))
    a, _ = await scheduler.schedule_bulk(
        [first, JobSpec(t.collect, now(), ("b",), depends_on=[first])]
    )
    await wait_until(lambda: _ran(pool, "b"), timeout=10, message="b to run")

    async def both_gone() -> bool:  # b's own completion deletes it, and its edges
        return await count_rows(pool) == (0, 0)

    await wait_until(both_gone, timeout=10, message="both rows and the edge deleted")
    with pytest.raises(ValueError, match="do not exist"):  # gone: an unknown id
        await scheduler.schedule(t.step, execution_time=now(), depends_on=[a])


async def _ran(pool: asyncpg.Pool, name: str) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT count(*) FROM dep_runs WHERE ended_at IS NOT NULL AND name = $1", name
        )
    )


# -- bad input writes nothing --------------------------------------------------------


def _spec_cycle(a: JobSpec) -> list[JobSpec]:
    """Specs naming each other: the first changed after the second was made."""
    b = JobSpec(t.step, later(), ("b",), depends_on=[a])
    c = JobSpec(t.step, later(), ("c",), depends_on=[b])
    a.depends_on = [*a.depends_on, c]
    return [a, b, c]


@pytest.mark.parametrize(
    "build, error, match",
    [
        pytest.param(
            lambda a: [
                a,
                JobSpec(t.step, later(), ("b",), depends_on=[a], job_id="b"),
                JobSpec(t.step, later(), ("c",), job_id="c", depends_on=["b", "d"]),
                JobSpec(t.step, later(), ("d",), job_id="d", depends_on=["c"]),
            ],
            ValueError,
            "cycle",
            id="cycle",
        ),
        pytest.param(lambda a: _spec_cycle(a), ValueError, "cycle", id="spec-cycle"),
        pytest.param(
            lambda a: [a, JobSpec(t.step, later(), ("b",), job_id="b", depends_on=["b"])],
            ValueError,
            "depends on itself",
            id="itself",
        ),
        pytest.param(
            lambda a: [a, JobSpec(t.step, later(), ("b",), depends_on=[a, "no-such-job"])],
            ValueError,
            "do not exist",
            id="unknown-id",
        ),
        pytest.param(
            lambda a: [a, JobSpec(t.step, later(), ("b",), depends_on=[JobSpec(t.step, later())])],
            ValueError,
            "not in this schedule_bulk call",
            id="spec-elsewhere",
        ),
        pytest.param(
            lambda a: [a, JobSpec(t.step, later(), ("b",), depends_on=[a], dedupe_key="k")],
            ValueError,
            "dedupe key",
            id="dedupe-key",
        ),
    ],
)
async def test_a_bad_graph_is_refused_and_writes_nothing(pool, make_scheduler, build, error, match):
    scheduler = await make_scheduler(start=False)
    existing = await scheduler.schedule(t.step, execution_time=later(), args=("old",))
    before = await count_rows(pool)
    a = JobSpec(t.step, later(), ("a",), depends_on=[existing])
    with pytest.raises(error, match=match):
        await scheduler.schedule_bulk(build(a))
    assert await count_rows(pool) == before
    assert not (await row(pool, existing))["has_dependents"]  # the lock's mark rolled back


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"depends_on": "a-job-id"}, TypeError, "depends_on must be a list"),
        ({"depends_on": [5]}, TypeError, "depends_on must hold"),
        ({"depends_on": [""]}, ValueError, "empty job id"),
        ({"depends_on": ["x"], "on_dependency_failure": "retry"}, ValueError, "on_dependency"),
        ({"depends_on": ["no-such-job"]}, ValueError, "do not exist"),
        (
            {"depends_on": ["x"], "conflict_resolution": ConflictResolution.REPLACE},
            ValueError,
            "REPLACE",
        ),
    ],
)
async def test_bad_dependencies_of_one_job_raise_and_write_nothing(
    pool, make_scheduler, options, error, match
):
    scheduler = await make_scheduler(start=False)
    await scheduler.schedule(t.step, execution_time=later(), args=("x",), job_id="x")
    before = await count_rows(pool)
    with pytest.raises(error, match=match):
        await scheduler.schedule(t.step, execution_time=now(), args=("y",), **options)
    with pytest.raises(error, match=match):
        await scheduler.schedule_job("dep.step", now(), {"args": ["y"]}, **options)
    assert await count_rows(pool) == before


async def test_schedule_takes_ids_not_specs(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    with pytest.raises(TypeError, match="schedule_bulk"):
        await scheduler.schedule(t.step, execution_time=now(), depends_on=[JobSpec(t.step, now())])
    assert await count_rows(pool) == (0, 0)


# -- the ways in -----------------------------------------------------------------------


async def test_schedule_bulk_with_given_ids_is_idempotent_under_ignore(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)

    def graph() -> list[JobSpec]:
        a = JobSpec(t.step, later(), ("a",), job_id="g-a")
        b = JobSpec(t.step, later(), ("b",), job_id="g-b", depends_on=[a])
        return [a, b, JobSpec(t.step, later(), ("c",), job_id="g-c", depends_on=["g-b", a])]

    assert await scheduler.schedule_bulk(graph()) == ["g-a", "g-b", "g-c"]
    again = await scheduler.schedule_bulk(graph(), positional=True)
    assert again == [None, None, None]
    assert await count_rows(pool) == (3, 3)
    with pytest.raises(ValueError, match="already exist"):
        await scheduler.schedule_bulk(graph(), conflict_resolution=ConflictResolution.RAISE)
    # A new node on an existing one: its id given again is skipped, the new one waits on it.
    a = JobSpec(t.step, later(), ("a",), job_id="g-a")
    d = JobSpec(t.step, later(), ("d",), job_id="g-d", depends_on=[a])
    assert await scheduler.schedule_bulk([a, d], positional=True) == [None, "g-d"]
    assert (await row(pool, "g-d"))["status"] == "waiting"


async def test_a_large_graph_goes_in_by_copy_with_the_same_rows(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    root = JobSpec(t.step, later(), ("root",))
    middle = [JobSpec(t.step, later(), (i,), depends_on=[root]) for i in range(300)]
    sink = JobSpec(t.step, later(), ("sink",), depends_on=middle)
    ids = await scheduler.schedule_bulk([root, *middle, sink])
    assert len(ids) == 302
    assert await count_rows(pool) == (302, 600)
    statuses = await pool.fetch(
        "SELECT status, wait_kind, dependencies_unmet, count(*) FROM scheduled_jobs"
        " GROUP BY 1, 2, 3 ORDER BY 4"
    )
    assert [tuple(r) for r in statuses] == [
        ("pending", None, None, 1),
        ("waiting", "dependencies", 300, 1),
        ("waiting", "dependencies", 1, 300),
    ]


async def test_inside_a_callers_transaction_that_rolls_back_nothing_is_written(
    pool, make_scheduler
):
    scheduler = await make_scheduler(start=False)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        a = await scheduler.schedule(t.step, execution_time=now(), connection=conn)
        await scheduler.schedule(t.step, execution_time=now(), depends_on=[a], connection=conn)
        await tx.rollback()
    assert await count_rows(pool) == (0, 0)


async def test_the_sync_client_schedules_dependents_on_its_own_connection(
    pool, dsn, make_scheduler
):
    await make_scheduler()

    def produce() -> list[str]:
        with SyncClient(dsn) as client:
            a = client.schedule(t.step, execution_time=now(), args=("a",))
            b = client.schedule(t.step, execution_time=now(), args=("b",), depends_on=[a])
            ids = client.schedule_bulk(
                chain(
                    JobSpec(t.step, now(), ("c",)), JobSpec(t.step, now(), ("d",), depends_on=[b])
                )
            )
            return [a, b, *ids]

    ids = await asyncio.to_thread(produce)
    await all_final(pool, ids)
    done = await runs(pool)
    assert done["b"]["ended_at"] <= done["d"]["started_at"]
    assert done["c"]["ended_at"] <= done["d"]["started_at"]


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
async def test_the_sync_client_writes_dependents_in_a_callers_transaction(
    pool, dsn, make_scheduler, driver
):
    """Through a caller's DB-API connection: inside its transaction, committed
    or rolled back with it; a bad graph leaves the caller's transaction usable."""
    driver_module = pytest.importorskip(driver)
    await make_scheduler()

    def produce(commit: bool) -> list[str]:
        conn = driver_module.connect(dsn)
        try:
            with SyncClient(dsn) as client:
                a = client.schedule(t.step, execution_time=now(), args=("a",), connection=conn)
                b = client.schedule(
                    t.step, execution_time=now(), args=("b",), depends_on=[a], connection=conn
                )
                with pytest.raises(ValueError, match="do not exist"):
                    client.schedule(
                        t.step, execution_time=now(), depends_on=["nope"], connection=conn
                    )
                ids = client.schedule_bulk(
                    chain(
                        JobSpec(t.step, now(), ("c",), depends_on=[b]),
                        JobSpec(t.step, now(), ("d",)),
                    ),
                    connection=conn,
                )
            if commit:
                conn.commit()
            else:
                conn.rollback()
            return [a, b, *ids]
        finally:
            conn.close()

    assert await asyncio.to_thread(produce, False)
    assert await count_rows(pool) == (0, 0)
    ids = await asyncio.to_thread(produce, True)
    await all_final(pool, ids)
    done = await runs(pool)
    assert done["a"]["ended_at"] <= done["b"]["started_at"] <= done["c"]["started_at"]
    assert done["c"]["ended_at"] <= done["d"]["started_at"]


async def test_a_chord_runs_its_callback_with_the_headers_results(pool, make_scheduler):
    scheduler = await make_scheduler()
    flow = chain(
        JobSpec(t.step, now(), ("start",)),
        chord(
            group(*(JobSpec(t.step, now(), (f"part{i}",)) for i in range(5))),
            JobSpec(t.collect, now(), ("callback",)),
        ),
    )
    ids = await scheduler.schedule_bulk(flow)
    await all_final(pool, ids)
    results: list[list[Any]] = await scheduler.result(ids[-1])
    assert results == [[ids[1 + i], f"part{i}"] for i in range(5)]
    done = await runs(pool)
    assert all(done["start"]["ended_at"] <= done[f"part{i}"]["started_at"] for i in range(5))


async def test_dependencies_in_a_schema_of_their_own(pool, make_scheduler):
    """The functions, their channels and the statements' qualified names in
    another schema: a chain runs in order, and a failure cancels (its event
    heard by wait_for)."""
    schema = "deps_elsewhere"
    await pool.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")
    scheduler = await make_scheduler(schema=schema)
    try:
        flow = chain(JobSpec(t.step, now(), ("a",)), JobSpec(t.collect, now(), ("b",)))
        bad = chain(JobSpec(t.fail, now(), ("bad",)), JobSpec(t.step, now(), ("never",)))
        ids = await scheduler.schedule_bulk([*flow, *bad])
        assert await scheduler.result(ids[1], timeout=10) == [[ids[0], "a"]]
        job = await scheduler.wait_for(ids[3], timeout=10)
        assert (
            job.status == "cancelled" and job.error == f"cancelled: its dependency {ids[2]} failed"
        )
        assert await pool.fetchval(f"SELECT count(*) FROM {schema}.job_dependencies") == 2
        assert await pool.fetchval("SELECT count(*) FROM public.job_dependencies") == 0
    finally:
        await scheduler.shutdown(grace_period=1.0)  # before its tables go
        await pool.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def test_a_dependent_written_while_its_dependency_completes_is_never_left_waiting(pool):
    """Both orders of the race, each held open: the dependent's write waits for
    the completion's commit and sees it completed; a completion that waits
    for the dependent's write releases it once that commits."""
    producer = Scheduler(pool)
    store = Store(pool)

    async def running(name: str) -> str:
        job_id = await producer.schedule(t.step, execution_time=later(), args=(name,))
        await pool.execute(
            "UPDATE scheduled_jobs SET status = 'running', worker_id = 'w1', attempts = 1"
            " WHERE job_id = $1",
            job_id,
        )
        return job_id

    # 1. The completion first, not committed: the dependent's write waits for it.
    first = await running("first")
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await store.complete("w1", [Completion(first, 1, '"r1"')], False, conn)
        write = asyncio.create_task(
            producer.schedule(t.step, execution_time=later(), depends_on=[first])
        )
        await wait_until(
            lambda: _blocked_on_lock(pool), message="the dependent's write waiting for the lock"
        )
        assert not write.done()
        await tx.commit()
    dependent = await write
    assert (await row(pool, dependent))["status"] == "pending"

    # 2. The dependent's write first, not committed: the completion waits for it.
    second = await running("second")
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        dependent = await producer.schedule(
            t.step, execution_time=later(), depends_on=[second], connection=conn
        )
        completion = asyncio.create_task(
            store.complete("w1", [Completion(second, 1, '"r2"')], False)
        )
        await wait_until(
            lambda: _blocked_on_lock(pool), message="the completion waiting for the lock"
        )
        assert not completion.done()
        await tx.commit()
    assert await completion == {second}
    got = await row(pool, dependent)
    assert (got["status"], got["dependencies_unmet"]) == ("pending", 0)


async def _blocked_on_lock(pool: asyncpg.Pool) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"
        )
    )
