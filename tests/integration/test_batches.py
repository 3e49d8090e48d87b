"""Batch tasks on real PostgreSQL: batches fill up to batch_size, a partial
batch runs after batch_timeout, each job's outcome, attempts and retries are
its own, a handler that raises or returns the wrong number of results fails
each job (never a loop), one job of a running batch can be cancelled, and bad
options are refused at the call with nothing written."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from pg_scheduler import BatchItem, JobPriority, JobSpec, RetryPolicy, Scheduler
from pg_scheduler.tasks import TaskOptions, TaskRegistry
from pg_scheduler.workflows.decorator import WorkflowOptions, mark_workflow
from tests.support.common import wait_for_status, wait_until

NO_WAIT = RetryPolicy(base_delay=0, jitter=0)


async def statuses(pool: Any) -> dict[str, int]:
    rows = await pool.fetch("SELECT status, count(*) AS n FROM scheduled_jobs GROUP BY 1")
    return {r["status"]: r["n"] for r in rows}


async def all_settled(pool: Any, total: int, timeout: float = 20.0) -> None:
    async def done() -> bool:
        found = await statuses(pool)
        return (
            found.get("pending", 0) + found.get("running", 0) == 0 and sum(found.values()) == total
        )

    await wait_until(done, timeout=timeout, message=f"{total} jobs settled")


async def test_batches_fill_up_to_batch_size_and_each_job_keeps_its_result(make_scheduler, pool):
    scheduler: Scheduler = await make_scheduler(start=False)
    calls: list[list[int]] = []

    @scheduler.task(batch_size=10, batch_timeout=timedelta(seconds=30))
    async def square(batch: list[BatchItem]) -> list[int]:
        calls.append([item.arg for item in batch])
        return [item.arg * item.arg for item in batch]

    now = datetime.now(UTC)
    ids = await scheduler.schedule_bulk([JobSpec(square, now, (n,)) for n in range(30)])
    await scheduler.start()
    await all_settled(pool, 30)
    # Full batches run at once, long before batch_timeout.
    assert sorted(len(c) for c in calls) == [10, 10, 10]
    assert sorted(n for c in calls for n in c) == list(range(30))
    rows = await pool.fetch(
        "SELECT job_id, status, result::text AS result, attempts FROM scheduled_jobs"
    )
    by_id = {r["job_id"]: r for r in rows}
    for n, job_id in enumerate(ids):
        assert by_id[job_id]["status"] == "completed"
        assert by_id[job_id]["result"] == str(n * n)
        assert by_id[job_id]["attempts"] == 1


async def test_a_partial_batch_runs_after_batch_timeout(make_scheduler, pool):
    scheduler: Scheduler = await make_scheduler()
    calls: list[tuple[float, list[str]]] = []
    timeout = 0.8

    @scheduler.task(batch_size=50, batch_timeout=timeout)
    async def collect(batch: list[BatchItem]) -> list[None]:
        calls.append((time.monotonic(), [item.kwargs["name"] for item in batch]))
        return [None] * len(batch)

    started = time.monotonic()
    for name in ("a", "b", "c"):
        await scheduler.schedule(collect, kwargs={"name": name})
    await all_settled(pool, 3)
    [(at, names)] = calls
    assert sorted(names) == ["a", "b", "c"]
    # Not before the timeout after the first due job (a little slack for clocks).
    assert at - started >= timeout - 0.1


async def test_per_item_failures_retry_alone_in_a_later_batch(make_scheduler, pool):
    scheduler: Scheduler = await make_scheduler(start=False)
    calls: list[list[tuple[int, int]]] = []

    @scheduler.task(batch_size=10, batch_timeout=0.2)
    async def deliver(batch: list[BatchItem]) -> list[Any]:
        calls.append([(item.arg, item.attempt) for item in batch])
        return [
            ValueError(f"odd {item.arg}")
            if item.arg % 2 and item.attempt == 1
            else f"ok {item.arg}"
            for item in batch
        ]

    now = datetime.now(UTC)
    specs = [
        # Odd jobs fail once; jobs 1 and 3 may retry once, 5 and 7 may not.
        JobSpec(deliver, now, (n,), max_retries=1 if n in (1, 3) else 0, retry_policy=NO_WAIT)
        for n in range(8)
    ]
    ids = await scheduler.schedule_bulk(specs)
    await scheduler.start()
    await all_settled(pool, 8)
    rows = {
        r["job_id"]: r
        for r in await pool.fetch(
            "SELECT job_id, status, result::text AS result, attempts, retry_count,"
            " error_message FROM scheduled_jobs"
        )
    }
    for n, job_id in enumerate(ids):
        row = rows[job_id]
        if n in (5, 7):
            assert (row["status"], row["attempts"]) == ("failed", 1)
            assert row["error_message"] == f"ValueError: odd {n}"
        elif n in (1, 3):
            assert (row["status"], row["attempts"], row["retry_count"]) == ("completed", 2, 1)
            assert row["result"] == f'"ok {n}"'
        else:
            assert (row["status"], row["attempts"], row["result"]) == ("completed", 1, f'"ok {n}"')
    # The first batch held all eight; the retries ran again, without the others.
    assert sorted(calls[0]) == [(n, 1) for n in range(8)]
    assert sorted(p for c in calls[1:] for p in c) == [(1, 2), (3, 2)]
    # Each failed attempt has its own attempt row.
    attempts = await pool.fetch("SELECT job_id, outcome FROM job_attempts ORDER BY job_id")
    assert sorted(r["job_id"] for r in attempts) == sorted(ids[n] for n in (1, 3, 5, 7))


async def test_a_raising_handler_fails_each_job_by_its_own_policy(make_scheduler, pool):
    scheduler: Scheduler = await make_scheduler(start=False)
    calls: list[int] = []

    @scheduler.task(batch_size=5, batch_timeout=0.1)
    async def broken(batch: list[BatchItem]) -> list[Any]:
        calls.append(len(batch))
        raise RuntimeError("smtp down")

    now = datetime.now(UTC)
    retried, final = await scheduler.schedule_bulk(
        [
            JobSpec(broken, now, ("r",), max_retries=2, retry_policy=NO_WAIT),
            JobSpec(broken, now, ("f",)),
        ]
    )
    await scheduler.start()
    await all_settled(pool, 2)
    for job_id, attempts in ((retried, 3), (final, 1)):
        job = await scheduler.get_job(job_id)
        assert job is not None
        assert job.status == "failed"
        assert job.attempts == attempts
        assert job.error is not None
        assert job.error.startswith("RuntimeError: smtp down")
    assert sum(calls) == 4  # 2 jobs, then the retries of one of them


@pytest.mark.parametrize("returned", ["short", "not a list"])
async def test_a_wrong_number_of_results_fails_each_job_once(make_scheduler, pool, returned):
    scheduler: Scheduler = await make_scheduler(start=False)
    calls: list[int] = []

    @scheduler.task(batch_size=5, batch_timeout=0.1)
    async def sloppy(batch: list[BatchItem]) -> Any:
        calls.append(len(batch))
        return [1] if returned == "short" else {"all": "done"}

    now = datetime.now(UTC)
    ids = await scheduler.schedule_bulk([JobSpec(sloppy, now, (n,)) for n in range(3)])
    await scheduler.start()
    await all_settled(pool, 3)
    for job_id in ids:
        job = await scheduler.get_job(job_id)
        assert job is not None
        assert (job.status, job.attempts) == ("failed", 1)
        assert job.error is not None
        assert "one result per job" in job.error
    assert calls == [3]  # recorded, not run again


async def test_cancelling_one_job_of_a_running_batch(make_scheduler, pool):
    scheduler: Scheduler = await make_scheduler(start=False)
    entered = asyncio.Event()
    release = asyncio.Event()
    seen: dict[str, bool] = {}

    @scheduler.task(batch_size=3, batch_timeout=0.1)
    async def slow(batch: list[BatchItem]) -> list[str]:
        entered.set()
        await release.wait()
        seen.update({item.arg: item.cancelled for item in batch})
        return [item.arg for item in batch]

    now = datetime.now(UTC)
    a, b, c = await scheduler.schedule_bulk([JobSpec(slow, now, (n,)) for n in "abc"])
    await scheduler.start()
    await asyncio.wait_for(entered.wait(), 10)
    assert await scheduler.cancel_job(b)

    # The cancel reaches the worker through NOTIFY: the item is marked, the
    # handler keeps running for the other two.
    await wait_until(
        lambda: any(
            r.cancel_reason is not None for j, r in scheduler.worker.running.items() if j == b
        ),
        message="the cancel reached the batch",
    )
    release.set()
    await wait_for_status(pool, a, "completed")
    await wait_for_status(pool, c, "completed")
    assert seen == {"a": False, "b": True, "c": False}
    job = await scheduler.get_job(b)
    assert job is not None and job.status == "cancelled" and job.result is None


async def test_cancelling_every_job_cancels_the_handler(make_scheduler, pool):
    scheduler: Scheduler = await make_scheduler(start=False)
    entered = asyncio.Event()
    stopped = asyncio.Event()

    @scheduler.task(batch_size=2, batch_timeout=0.1)
    async def hang(batch: list[BatchItem]) -> list[None]:
        entered.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        return [None] * len(batch)

    now = datetime.now(UTC)
    ids = await scheduler.schedule_bulk([JobSpec(hang, now, (n,)) for n in range(2)])
    await scheduler.start()
    await asyncio.wait_for(entered.wait(), 10)
    for job_id in ids:
        assert await scheduler.cancel_job(job_id)
    await asyncio.wait_for(stopped.wait(), 10)
    await wait_until(lambda: scheduler.worker.slots.held == 0, message="the slot given back")
    assert await statuses(pool) == {"cancelled": 2}


async def test_a_thread_handler(make_scheduler, pool):
    scheduler: Scheduler = await make_scheduler(start=False)

    threads: set[str] = set()

    @scheduler.task(batch_size=4, batch_timeout=0.1, executor="thread")
    def shout(batch: list[BatchItem]) -> list[str]:
        threads.add(threading.current_thread().name)
        return [item.arg.upper() for item in batch]

    now = datetime.now(UTC)
    ids = await scheduler.schedule_bulk([JobSpec(shout, now, (w,)) for w in ("x", "y")])
    await scheduler.start()
    await all_settled(pool, 2)
    results = [(await scheduler.get_job(i)).result for i in ids]  # type: ignore[union-attr]
    assert results == ["X", "Y"]
    assert threads and all(name.startswith("pg_scheduler-job") for name in threads)


async def test_a_batch_takes_one_slot(make_scheduler, pool):
    """max_concurrent_jobs bounds handlers: with one slot, one batch at a time."""
    scheduler: Scheduler = await make_scheduler(start=False, max_concurrent_jobs=1)
    active = 0
    most = 0
    sizes: list[int] = []

    @scheduler.task(batch_size=10, batch_timeout=0.1)
    async def step(batch: list[BatchItem]) -> list[None]:
        nonlocal active, most
        active += 1
        most = max(most, active)
        await asyncio.sleep(0.02)
        sizes.append(len(batch))
        active -= 1
        return [None] * len(batch)

    now = datetime.now(UTC)
    await scheduler.schedule_bulk([JobSpec(step, now, (n,)) for n in range(40)])
    await scheduler.start()
    await all_settled(pool, 40)
    assert most == 1
    assert sizes == [10, 10, 10, 10]


async def test_plain_jobs_beside_a_batch_task(make_scheduler, pool):
    scheduler: Scheduler = await make_scheduler()

    @scheduler.task(batch_size=5, batch_timeout=0.1)
    async def batched(batch: list[BatchItem]) -> list[int]:
        return [len(batch)] * len(batch)

    @scheduler.task
    async def plain(n: int) -> int:
        return n

    ids = [await scheduler.schedule(plain, args=(n,)) for n in range(5)]
    ids += [await scheduler.schedule(batched, args=(n,)) for n in range(5)]
    await all_settled(pool, 10)
    assert await statuses(pool) == {"completed": 10}
    # The plain jobs ran one at a time (their function takes one argument).
    assert [(await scheduler.get_job(i)).result for i in ids[:5]] == list(range(5))  # type: ignore[union-attr]


# -- the batch marker (migration 0020) ------------------------------------------------


async def marks(pool: Any) -> dict[str, tuple[str | None, int | None]]:
    """job id -> (batch_id, batch_size) of the latest batch naming it, as stored
    (scheduler_batches); (None, None) for a job in none."""
    rows = await pool.fetch(
        "SELECT j.job_id, b.batch_id::text AS batch_id, b.batch_size FROM scheduled_jobs j"
        " LEFT JOIN LATERAL (SELECT batch_id, batch_size FROM scheduler_batches"
        "  WHERE job_ids @> ARRAY[j.job_id] ORDER BY started_at DESC LIMIT 1) b ON true"
    )
    return {r["job_id"]: (r["batch_id"], r["batch_size"]) for r in rows}


async def test_jobs_of_one_batch_share_its_id_and_size(make_scheduler, pool):
    scheduler: Scheduler = await make_scheduler(start=False)
    calls: list[list[str]] = []

    @scheduler.task(batch_size=10, batch_timeout=0.1)
    async def square(batch: list[BatchItem]) -> list[int]:
        calls.append([item.job_id for item in batch])
        return [item.arg * item.arg for item in batch]

    @scheduler.task
    async def plain(n: int) -> int:
        return n

    now = datetime.now(UTC)
    ids = await scheduler.schedule_bulk([JobSpec(square, now, (n,)) for n in range(25)])
    plain_id = await scheduler.schedule(plain, args=(1,))
    await scheduler.start()
    await all_settled(pool, 26)
    assert sorted(len(c) for c in calls) == [5, 10, 10]
    final = await marks(pool)
    batch_ids = set()
    for call in calls:
        # One id and size per call of the handler, on record once its jobs ended.
        [(batch_id, size)] = {final[job_id] for job_id in call}
        assert size == len(call)
        assert batch_id is not None and batch_id not in batch_ids
        batch_ids.add(batch_id)
    assert sorted(job_id for call in calls for job_id in call) == sorted(ids)
    job = await scheduler.get_job(ids[0])
    assert job is not None and (job.batch_id, job.batch_size) == final[ids[0]]
    plain_job = await scheduler.get_job(plain_id)
    assert plain_job is not None and plain_job.status.value == "completed"
    assert (plain_job.batch_id, plain_job.batch_size) == (None, None)


async def test_a_retried_job_carries_the_batch_it_ran_in_last(make_scheduler, pool):
    scheduler: Scheduler = await make_scheduler(start=False)
    seen: list[set[str]] = []

    @scheduler.task(batch_size=10, batch_timeout=0.1)
    async def deliver(batch: list[BatchItem]) -> list[Any]:
        seen.append({item.job_id for item in batch})
        return [
            ValueError("bounced") if item.arg == "retry" and item.attempt == 1 else item.arg
            for item in batch
        ]

    now = datetime.now(UTC)
    ok, retried = await scheduler.schedule_bulk(
        [
            JobSpec(deliver, now, ("ok",)),
            JobSpec(deliver, now, ("retry",), max_retries=1, retry_policy=NO_WAIT),
        ]
    )
    await scheduler.start()
    await all_settled(pool, 2)
    assert seen == [{ok, retried}, {retried}]
    # Both batches are on record; the retried job's latest is the second.
    recorded = await pool.fetch(
        "SELECT batch_id::text AS batch_id, batch_size, job_ids FROM scheduler_batches"
        " ORDER BY started_at"
    )
    assert [(r["batch_size"], set(r["job_ids"])) for r in recorded] == [
        (2, {ok, retried}),
        (1, {retried}),
    ]
    first, second = (r["batch_id"] for r in recorded)
    final = await marks(pool)
    assert final[ok] == (first, 2)
    assert final[retried] == (second, 1)
    job = await scheduler.get_job(retried)
    assert job is not None and (job.attempts, job.batch_id, job.batch_size) == (2, second, 1)


async def test_a_mark_that_cannot_be_written_leaves_the_batch_running(make_scheduler, pool):
    """The marker's statement fails (a trigger refuses it): the batch runs and
    completes, unmarked, and the worker says why at WARNING."""
    await pool.execute(
        """
        CREATE FUNCTION refuse_batch_mark() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'no batch marks here'; END $$;
        CREATE TRIGGER refuse_batch_mark BEFORE INSERT ON scheduler_batches
            FOR EACH ROW EXECUTE FUNCTION refuse_batch_mark();
        """
    )
    try:
        scheduler: Scheduler = await make_scheduler(start=False)

        @scheduler.task(batch_size=3, batch_timeout=0.1)
        async def echo(batch: list[BatchItem]) -> list[Any]:
            return [item.arg for item in batch]

        now = datetime.now(UTC)
        ids = await scheduler.schedule_bulk([JobSpec(echo, now, (n,)) for n in range(3)])
        with capture_logs() as logs:
            await scheduler.start()
            await all_settled(pool, 3)
        assert await statuses(pool) == {"completed": 3}
        assert set((await marks(pool)).values()) == {(None, None)}
        [warning] = [e for e in logs if e["event"].startswith("batch not marked")]
        assert warning["log_level"] == "warning" and warning["jobs"] == 3
        assert "no batch marks here" in warning["error"]
        assert [(await scheduler.get_job(i)).result for i in ids] == [0, 1, 2]  # type: ignore[union-attr]
    finally:
        await pool.execute(
            "DROP TRIGGER refuse_batch_mark ON scheduler_batches; DROP FUNCTION refuse_batch_mark()"
        )


async def test_a_batch_is_one_row_naming_its_jobs(make_scheduler, pool):
    """The mark is one row of scheduler_batches per call of the handler: its
    task, queue, worker, size and the ids of the jobs it was given."""
    scheduler: Scheduler = await make_scheduler(start=False)

    @scheduler.task(batch_size=4, batch_timeout=0.1)
    async def echo(batch: list[BatchItem]) -> list[Any]:
        return [item.arg for item in batch]

    now = datetime.now(UTC)
    ids = await scheduler.schedule_bulk([JobSpec(echo, now, (n,), queue="q1") for n in range(4)])
    await scheduler.start()
    await all_settled(pool, 4)
    [row] = await pool.fetch("SELECT * FROM scheduler_batches")
    task_name = await pool.fetchval("SELECT DISTINCT task_name FROM scheduled_jobs")
    assert (row["task_name"], row["queue"], row["batch_size"]) == (task_name, "q1", 4)
    assert row["worker_id"] == scheduler.worker_id
    assert sorted(row["job_ids"]) == sorted(ids)


async def test_the_mark_is_fenced_on_the_lease(pool):
    """Written only while the batch's first job is still this worker's attempt
    (a worker that lost its jobs writes nothing); it names every job the
    handler is given, one cancelled since included."""
    from pg_scheduler.store.batches import BatchStore
    from pg_scheduler.store.names import Qualifier

    await pool.execute(
        "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
        " worker_id, attempts) VALUES"
        " ('a', 't', 't', now(), 'running', 'w1', 1),"
        " ('b', 't', 't', now(), 'cancelled', 'w1', 1),"
        " ('c', 't', 't', now(), 'running', 'w2', 2)"
    )
    store = BatchStore(pool, Qualifier())
    batch = "6f0d9a52-4c57-4f43-9b56-7d7a7f0e0c01"
    assert await store.mark(batch, "t", "q", [("a", 1), ("b", 1)], worker_id="w1") == 2
    row = await pool.fetchrow("SELECT * FROM scheduler_batches")
    assert (row["batch_size"], row["job_ids"], row["worker_id"]) == (2, ["a", "b"], "w1")
    assert (row["task_name"], row["queue"]) == ("t", "q")
    # 'c' was claimed anew (attempt 2, by w2): w1's late mark of attempt 1 is
    # not written, nor is a mark by a worker that does not hold it.
    late = "6f0d9a52-4c57-4f43-9b56-7d7a7f0e0c02"
    assert await store.mark(late, "t", "q", [("c", 1)], worker_id="w1") == 0
    assert await store.mark(late, "t", "q", [("c", 2)], worker_id="w1") == 0
    assert await store.mark(late, "t", "q", [("gone", 1)], worker_id="w1") == 0
    assert await pool.fetchval("SELECT count(*) FROM scheduler_batches") == 1


async def test_the_vacuum_drops_batches_older_than_every_job_left(make_scheduler, pool):
    """Batches that started before the oldest job still in scheduled_jobs (of
    any status) go, in statements of at most the vacuum's batch_size; the
    others stay, and a job's batch is still found."""
    from pg_scheduler import VacuumConfig, VacuumPolicy

    config = VacuumConfig(completed=VacuumPolicy.after_days(1), batch_size=2)
    scheduler: Scheduler = await make_scheduler(start=False, vacuum_config=config)
    await pool.execute(
        "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
        " created_at, finished_at) VALUES"
        " ('old', 't', 't', now(), 'completed', now() - interval '3 days',"
        "  now() - interval '3 days'),"
        " ('kept', 't', 't', now(), 'completed', now() - interval '10 hours',"
        "  now() - interval '9 hours'),"
        " ('later', 't', 't', now(), 'pending', now() - interval '1 hour', NULL)"
    )
    # Five batches of jobs gone (started 3 days to 11 hours ago), one of 'kept'
    # and 'old' (started 9 hours ago), one of 'later'.
    await pool.execute(
        "INSERT INTO scheduler_batches (batch_id, task_name, queue, started_at, batch_size,"
        " job_ids)"
        " SELECT gen_random_uuid(), 't', 'default', now() - make_interval(hours => h), 1,"
        "        ARRAY['gone' || h]"
        "   FROM unnest(ARRAY[72, 48, 30, 20, 11]) AS h;"
        "INSERT INTO scheduler_batches (batch_id, task_name, queue, started_at, batch_size,"
        " job_ids) VALUES"
        " ('00000000-0000-0000-0000-000000000009', 't', 'default',"
        "  now() - interval '9 hours', 2, ARRAY['kept', 'old']),"
        " ('00000000-0000-0000-0000-000000000001', 't', 'default',"
        "  now() - interval '50 minutes', 1, ARRAY['later'])"
    )
    counts = await scheduler.run_vacuum()
    assert counts["completed"] == 1  # 'old': the oldest job left is now 'kept'
    left = await pool.fetch("SELECT job_ids FROM scheduler_batches ORDER BY started_at")
    assert [r["job_ids"] for r in left] == [["kept", "old"], ["later"]]
    job = await scheduler.get_job("kept")
    assert job is not None and (job.batch_id, job.batch_size) == (
        "00000000-0000-0000-0000-000000000009",
        2,
    )
    # No job left at all: every batch goes.
    await pool.execute("DELETE FROM scheduled_jobs")
    await scheduler.run_vacuum()
    assert await pool.fetchval("SELECT count(*) FROM scheduler_batches") == 0


async def test_the_prune_is_bounded_and_uses_the_indexes(pool):
    from pg_scheduler.store.batches import PRUNE_BATCHES
    from pg_scheduler.store.housekeeping import _NOT_RUNNING, VacuumStore

    await pool.execute(
        "INSERT INTO scheduler_batches (batch_id, task_name, queue, started_at, batch_size,"
        " job_ids) SELECT gen_random_uuid(), 't', 'default', now() - make_interval(hours => n),"
        " 1, ARRAY['x' || n] FROM generate_series(1, 7) n"
    )
    store = VacuumStore(pool)
    async with pool.acquire() as conn:
        assert [await store.prune_batches(conn, 3) for _ in range(4)] == [3, 3, 1, 0]
        await conn.execute("SET enable_seqscan = off")
        try:
            plan = "\n".join(
                r[0]
                for r in await conn.fetch(
                    "EXPLAIN " + PRUNE_BATCHES.replace("$1", "3").replace("$2", "$1"),
                    _NOT_RUNNING,
                )
            )
        finally:
            await conn.execute("RESET enable_seqscan")
    assert "Seq Scan on scheduled_jobs" not in plan, plan
    assert "scheduled_jobs_dashboard_idx" in plan and "scheduled_jobs_running_idx" in plan, plan


# -- bad input ----------------------------------------------------------------------


async def handler(batch: list[BatchItem]) -> list[None]:
    return [None] * len(batch)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"batch_size": -3}, ValueError, "batch_size"),
        ({"batch_size": 10_001}, ValueError, "batch_size"),
        ({"batch_size": 2.5}, TypeError, "batch_size"),
        ({"batch_size": "10"}, TypeError, "batch_size"),
        ({"batch_size": True}, TypeError, "batch_size"),
        ({"batch_size": 5, "batch_timeout": -1}, ValueError, "batch_timeout"),
        ({"batch_size": 5, "batch_timeout": timedelta(seconds=-1)}, ValueError, "batch_timeout"),
        ({"batch_size": 5, "batch_timeout": float("nan")}, ValueError, "batch_timeout"),
        ({"batch_size": 5, "batch_timeout": "1s"}, TypeError, "batch_timeout"),
        ({"batch_timeout": 1}, ValueError, "batch_size"),
        ({"batch_size": 5, "executor": "process"}, ValueError, "process"),
        ({"batch_size": 5, "max_running": 2}, ValueError, "max_running"),
        ({"batch_size": 5, "rate_limit": "10/s"}, ValueError, "rate_limit"),
    ],
)
def test_bad_batch_options_are_refused_at_the_call(options, error, match):
    registry = TaskRegistry()
    with pytest.raises(error, match=match):
        registry.decorator(handler, _options(options))
    assert len(registry) == 0
    assert not hasattr(handler, "__pg_scheduler_batch__")


def _options(values: dict[str, Any]) -> TaskOptions:
    return TaskOptions(**values)


def test_a_batch_handler_must_take_the_list():
    registry = TaskRegistry()

    async def takes_nothing() -> list[None]:
        return []

    with pytest.raises(TypeError, match="takes the batch"):
        registry.decorator(takes_nothing, _options({"batch_size": 5}))
    assert len(registry) == 0


def test_a_workflow_cannot_be_a_batch_task():
    registry = TaskRegistry()

    async def flow(ctx: Any, batch: Any) -> None: ...

    mark_workflow(flow, WorkflowOptions(None))  # as @workflow does, registering nothing

    with pytest.raises(TypeError, match="workflow"):
        registry.decorator(flow, _options({"batch_size": 5}))
    assert len(registry) == 0


async def test_a_batch_tasks_jobs_take_any_arguments(make_scheduler, pool):
    """A job's arguments are its item's: not held to the handler's signature."""
    scheduler: Scheduler = await make_scheduler(start=False)

    @scheduler.task(batch_size=5)
    async def notify(batch: list[BatchItem]) -> list[None]:
        return [None] * len(batch)

    await scheduler.schedule(notify, args=("a", "b", "c"), kwargs={"x": 1})
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 1


async def test_shutdown_hands_a_running_batch_back(make_scheduler, pool):
    scheduler: Scheduler = await make_scheduler(start=False)
    entered = asyncio.Event()

    @scheduler.task(batch_size=3, batch_timeout=0.1)
    async def stuck(batch: list[BatchItem]) -> list[None]:
        entered.set()
        await asyncio.Event().wait()
        return [None] * len(batch)

    now = datetime.now(UTC)
    await scheduler.schedule_bulk([JobSpec(stuck, now, (n,)) for n in range(3)])
    await scheduler.start()
    await asyncio.wait_for(entered.wait(), 10)
    await scheduler.shutdown(grace_period=0.2)
    rows = await pool.fetch("SELECT status, worker_id FROM scheduled_jobs")
    assert [(r["status"], r["worker_id"]) for r in rows] == [("pending", None)] * 3


async def test_a_job_whose_lease_is_lost_mid_batch_is_not_written_by_it(make_scheduler, pool):
    """The database gives one job of a running batch back (as the rescuer
    does): the heartbeat marks its item, the batch's result for it is not
    written, and it runs again in a later batch."""
    scheduler: Scheduler = await make_scheduler(start=False)
    release = asyncio.Event()
    calls: list[dict[str, tuple[int, bool]]] = []
    entered = asyncio.Event()

    @scheduler.task(batch_size=2, batch_timeout=0.1)
    async def hold(batch: list[BatchItem]) -> list[str]:
        entered.set()
        await release.wait()
        calls.append({item.arg: (item.attempt, item.cancelled) for item in batch})
        return [f"{item.arg}@{item.attempt}" for item in batch]

    now = datetime.now(UTC)
    kept, lost = await scheduler.schedule_bulk([JobSpec(hold, now, (n,)) for n in "kl"])
    await scheduler.start()
    await asyncio.wait_for(entered.wait(), 10)
    await pool.execute(
        # Due again only later: the heartbeat sees it gone before a claim takes it back.
        "UPDATE scheduled_jobs SET status = 'pending', worker_id = NULL, lease_until = NULL,"
        " execution_time = now() + interval '1 second' WHERE job_id = $1",
        lost,
    )

    async def marked() -> bool:
        member = scheduler.worker.running.get(lost)
        return member is not None and member.cancel_reason is not None

    await wait_until(marked, message="the heartbeat saw the lease lost")
    release.set()
    await wait_for_status(pool, kept, "completed")
    await wait_for_status(pool, lost, "completed")
    assert calls[0] == {"k": (1, False), "l": (1, True)}
    assert (await scheduler.get_job(kept)).result == "k@1"  # type: ignore[union-attr]
    # Written by the later batch that claimed it again, not by the first.
    assert (await scheduler.get_job(lost)).result == "l@2"  # type: ignore[union-attr]
    await wait_until(lambda: scheduler.worker.slots.held == 0, message="every slot given back")
    assert scheduler.worker.state.owned == set()


async def test_a_batch_holds_one_queue_most_urgent_first(make_scheduler, pool):
    scheduler: Scheduler = await make_scheduler(start=False)
    calls: list[list[tuple[str, str]]] = []

    @scheduler.task(batch_size=4, batch_timeout=0.1)
    async def route(batch: list[BatchItem]) -> list[None]:
        calls.append([(item.queue, item.arg) for item in batch])
        return [None] * len(batch)

    now = datetime.now(UTC)
    await scheduler.schedule_bulk(
        [JobSpec(route, now, (f"e{n}",), queue="emails") for n in range(3)]
        + [JobSpec(route, now, (f"s{n}",), queue="sms") for n in range(3)]
        + [JobSpec(route, now, ("urgent",), queue="emails", priority=JobPriority.CRITICAL)]
    )
    await scheduler.start()
    await all_settled(pool, 7)
    assert all(len({queue for queue, _ in call}) == 1 for call in calls)
    by_queue = {call[0][0]: [arg for _, arg in call] for call in calls}
    assert sorted(by_queue) == ["emails", "sms"]
    assert by_queue["emails"][0] == "urgent"
    assert sorted(by_queue["emails"]) == ["e0", "e1", "e2", "urgent"]
    assert sorted(by_queue["sms"]) == ["s0", "s1", "s2"]


def test_a_bad_dedupe_key_leaves_no_batch_mark():
    registry = TaskRegistry()

    async def mailer(batch: list[BatchItem]) -> list[None]:
        return [None] * len(batch)

    with pytest.raises((TypeError, ValueError)):
        registry.decorator(mailer, _options({"batch_size": 5, "dedupe_scope": "forever"}))
    assert len(registry) == 0
    assert not hasattr(mailer, "__pg_scheduler_batch__")
