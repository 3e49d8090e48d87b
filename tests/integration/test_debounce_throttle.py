"""Debounce and throttle on enqueue (migration 0019), against real PostgreSQL:
one job per burst or period under calls from many connections and from two
processes, the burst's last (or merged) arguments, its due time read from the
row, the longest wait, bad input that writes nothing, and a caller's
transaction left to the caller."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from pg_scheduler import JobSpec, PollingConfig
from pg_scheduler.enqueue import timed
from tests.support import app_tasks, debounce_tasks
from tests.support.common import child_env, wait_for_status


async def rows(pool: asyncpg.Pool, key: str | None = None) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT job_id, status, dedupe_key, dedupe_scope, task_data::text AS data,"
        " execution_time, created_at, started_at FROM scheduled_jobs"
        " WHERE $1::text IS NULL OR dedupe_key = $1 ORDER BY created_at, job_id",
        key,
    )


async def count(pool: asyncpg.Pool) -> int:
    return await pool.fetchval(
        "SELECT (SELECT count(*) FROM scheduled_jobs) + (SELECT count(*) FROM scheduler_throttles)"
    )


async def db_now(pool: asyncpg.Pool) -> datetime:
    return await pool.fetchval("SELECT clock_timestamp()")


def args_of(row: asyncpg.Record) -> list:
    return json.loads(row["data"])["args"]


def kwargs_of(row: asyncpg.Record) -> dict:
    return json.loads(row["data"])["kwargs"]


@pytest.fixture(autouse=True)
def no_runs():
    debounce_tasks.runs.clear()
    yield
    debounce_tasks.runs.clear()


# Calls from a producer process: it waits for "go", makes its calls at once
# (args: its label and n), prints the ids it got.
PRODUCER = """
import asyncio, json, os, sys
import asyncpg
from pg_scheduler import Scheduler
from tests.support import app_tasks, debounce_tasks

async def main():
    mode, label, first, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=4, max_size=4)
    scheduler = Scheduler(pool)  # never started: it only enqueues
    timing = {"debounce": 2.0} if mode == "debounce" else {"throttle": 30}
    await pool.fetchval("SELECT 1")
    print("ready", flush=True)
    sys.stdin.readline()

    async def one(n):
        return await scheduler.schedule(
            debounce_tasks.reindex, args=(label, n), dedupe_key="burst", **timing)

    ids = await asyncio.gather(*(one(n) for n in range(first, first + total)))
    print(json.dumps(ids), flush=True)
    await pool.close()

asyncio.run(main())
"""


async def producers(dsn: str, mode: str) -> list[asyncio.subprocess.Process]:
    """Two producer processes, each ready to make its ten calls."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            PRODUCER,
            mode,
            f"proc{i}",
            str(first),
            "10",
            env=child_env(dsn),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for i, first in enumerate((100, 200))
    ]
    for p in procs:
        assert (await asyncio.wait_for(p.stdout.readline(), 60)).strip() == b"ready"
    return procs


async def go_and_collect(procs: list) -> list[str]:
    """Start the producers' calls; the ids they got, read as soon as printed."""
    for p in procs:
        p.stdin.write(b"go\n")
        await p.stdin.drain()
    ids: list[str] = []
    for p in procs:
        line = await asyncio.wait_for(p.stdout.readline(), 60)
        ids.extend(json.loads(line.decode()))
    return ids


async def finished(procs: list) -> None:
    for p in procs:
        await asyncio.wait_for(p.communicate(), 60)
        assert p.returncode == 0


# -- debounce ---------------------------------------------------------------------


async def test_a_burst_from_connections_and_two_processes_runs_once_with_the_last_args(
    pool, dsn, make_scheduler
):
    await make_scheduler()  # a worker, running all along
    client = await make_scheduler(start=False)
    procs = await producers(dsn, "debounce")

    async def here(n: int) -> str:
        return await client.schedule(
            debounce_tasks.reindex, args=("here", n), dedupe_key="burst", debounce=2.0
        )

    # 30 calls from this process's pool and 20 from two processes, together.
    local = asyncio.gather(*(here(n) for n in range(30)))
    remote = go_and_collect(procs)
    ids = [*await local, *await remote]
    before = await db_now(pool)
    last = await client.schedule(
        debounce_tasks.reindex, args=("last", 0), dedupe_key="burst", debounce=2.0
    )
    after = await db_now(pool)
    await finished(procs)
    assert set(ids) == {last}  # every call of the burst got its one job's id
    [row] = await rows(pool, "burst")
    assert row["dedupe_scope"] == "debounce"
    assert args_of(row) == ["last", 0]
    # Due two seconds after the last call (the database's clock).
    assert before + timedelta(seconds=2) <= row["execution_time"] <= after + timedelta(seconds=2)
    await wait_for_status(pool, last, "completed", timeout=15)
    [done] = await rows(pool, "burst")
    assert done["started_at"] >= row["execution_time"]
    assert debounce_tasks.runs == [("reindex", ("last", 0), {})]


async def test_max_wait_bounds_a_burst_that_never_stops(pool, make_scheduler):
    await make_scheduler()
    client = await make_scheduler(start=False)

    async def call(n: int) -> str:
        return await client.schedule(
            debounce_tasks.reindex,
            args=("steady", n),
            dedupe_key="steady",
            debounce=timedelta(seconds=0.8),
            debounce_max_wait=timedelta(seconds=2),
        )

    first = await call(0)
    [row] = await rows(pool, "steady")
    bound = row["created_at"] + timedelta(seconds=2)
    n = 0
    # Calls never 0.8 s apart: without the bound the job would never be due.
    while True:
        n += 1
        job_id = await call(n)
        if job_id != first:
            break  # the first burst's job has started: this call began the next
        [row] = await rows(pool, "steady")
        assert row["execution_time"] <= bound
        assert await db_now(pool) < bound + timedelta(seconds=10), "never started"
    await wait_for_status(pool, first, "completed", timeout=10)
    done = {r["job_id"]: r for r in await rows(pool, "steady")}
    assert done[first]["execution_time"] == bound
    assert done[first]["started_at"] >= bound
    assert done[job_id]["status"] == "pending"
    assert args_of(done[job_id]) == ["steady", n]


async def test_a_call_that_brings_the_due_time_forward_wakes_the_workers(pool, make_scheduler):
    """Workers asleep until the burst's first due time (a minute away, and
    polling at most every 30 s) hear of the earlier one at once."""
    await make_scheduler(polling_config=PollingConfig(max_interval=30, idle_start_interval=30))
    client = await make_scheduler(start=False)
    first = await client.schedule(
        debounce_tasks.reindex, args=("far", 0), dedupe_key="soon", debounce=60
    )
    again = await client.schedule(
        debounce_tasks.reindex, args=("near", 1), dedupe_key="soon", debounce=0.3
    )
    assert again == first
    [row] = await rows(pool, "soon")
    await wait_for_status(pool, first, "completed", timeout=10)
    [done] = await rows(pool, "soon")
    late = (done["started_at"] - row["execution_time"]).total_seconds()
    assert 0 <= late < 5, late  # not the 30 s poll, nor the minute
    assert debounce_tasks.runs == [("reindex", ("near", 1), {})]


async def test_the_tasks_merge_sees_every_call_of_a_burst(pool, make_scheduler):
    worker = await make_scheduler()
    client = await make_scheduler(start=False)

    async def call(i: int) -> str:
        return await client.schedule(
            debounce_tasks.collect, kwargs={"ids": [i]}, dedupe_key="ids", debounce=0.5
        )

    first = await call(0)
    assert await call(1) == first
    ids = await asyncio.gather(*(call(i) for i in range(2, 22)))
    assert set(ids) == {first}
    [row] = await rows(pool, "ids")
    merged = kwargs_of(row)["ids"]
    assert merged[:2] == [0, 1] and sorted(merged) == list(range(22))
    await wait_for_status(pool, first, "completed", timeout=10)
    assert debounce_tasks.runs == [("collect", (), {"ids": merged})]
    assert worker is not None


async def test_a_merge_that_raises_or_returns_no_arguments_writes_nothing(pool, make_scheduler):
    client = await make_scheduler(start=False)
    for func, error in ((debounce_tasks.broken, ValueError), (debounce_tasks.shapeless, TypeError)):
        first = await client.schedule(func, args=(1,), dedupe_key=func.__name__, debounce=30)
        [before] = await rows(pool, func.__name__)
        with pytest.raises(error, match="debounce_merge"):
            await client.schedule(func, args=(2,), dedupe_key=func.__name__, debounce=30)
        [after] = await rows(pool, func.__name__)
        assert after["job_id"] == first and dict(after) == dict(before)


async def test_the_tasks_own_debounce_and_key(pool, make_scheduler):
    await make_scheduler()
    client = await make_scheduler(start=False)
    ids = [
        await client.schedule(debounce_tasks.by_default, args=(7,), kwargs={"version": v})
        for v in range(5)
    ]
    assert len(set(ids)) == 1
    [row] = await rows(pool, "doc:7")
    assert row["dedupe_scope"] == "debounce"
    await wait_for_status(pool, ids[0], "completed", timeout=10)
    assert debounce_tasks.runs == [("by_default", (7, 4), {})]


async def test_a_call_while_the_job_runs_starts_a_new_burst(pool, make_scheduler):
    client = await make_scheduler(start=False)
    first = await client.schedule(
        debounce_tasks.reindex, args=("a", 1), dedupe_key="k", debounce=30
    )
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'running', worker_id = 'w', attempts = 1,"
        " started_at = now(), lease_until = now() + interval '1 hour' WHERE job_id = $1",
        first,
    )
    second = await client.schedule(
        debounce_tasks.reindex, args=("a", 2), dedupe_key="k", debounce=30
    )
    assert second != first
    stored = {r["job_id"]: r for r in await rows(pool, "k")}
    assert args_of(stored[first]) == ["a", 1] and args_of(stored[second]) == ["a", 2]


async def test_a_job_claimed_ahead_is_left_alone_until_it_starts(pool, make_scheduler):
    """A row waiting in a worker's buffer still holds its key; a call waits
    for its start (then begins a new burst) and never rewrites it."""
    client = await make_scheduler(start=False)
    first = await client.schedule(
        debounce_tasks.reindex, args=("a", 1), dedupe_key="k", debounce=30
    )
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'running', claimed_ahead = true, worker_id = 'w',"
        " attempts = 1, started_at = now(), lease_until = now() + interval '1 hour'"
        " WHERE job_id = $1",
        first,
    )
    call = asyncio.ensure_future(
        client.schedule(debounce_tasks.reindex, args=("a", 2), dedupe_key="k", debounce=30)
    )
    await pool.execute("UPDATE scheduled_jobs SET claimed_ahead = false WHERE job_id = $1", first)
    second = await asyncio.wait_for(call, 30)
    assert second != first
    stored = {r["job_id"]: r for r in await rows(pool, "k")}
    assert args_of(stored[first]) == ["a", 1] and args_of(stored[second]) == ["a", 2]


async def test_a_call_gives_up_on_a_job_claimed_ahead_for_too_long(
    pool, make_scheduler, monkeypatch
):
    client = await make_scheduler(start=False)
    first = await client.schedule(
        debounce_tasks.reindex, args=("a", 1), dedupe_key="k", debounce=30
    )
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'running', claimed_ahead = true, worker_id = 'w',"
        " attempts = 1, started_at = now(), lease_until = now() + interval '1 hour'"
        " WHERE job_id = $1",
        first,
    )
    [before] = await rows(pool, "k")
    monkeypatch.setattr(timed, "CLAIMED_WAIT", 0.3)
    for connection in (None, await pool.acquire()):
        try:
            with pytest.raises(TimeoutError, match="nothing was scheduled"):
                await client.schedule(
                    debounce_tasks.reindex,
                    args=("a", 2),
                    dedupe_key="k",
                    debounce=30,
                    connection=connection,
                )
        finally:
            if connection is not None:
                await pool.release(connection)
    assert [dict(r) for r in await rows(pool)] == [dict(before)]


# -- throttle ---------------------------------------------------------------------


async def test_throttle_first_call_wins_across_processes(pool, dsn, make_scheduler):
    client = await make_scheduler(start=False)
    procs = await producers(dsn, "throttle")

    async def here(n: int) -> str:
        return await client.schedule(
            debounce_tasks.reindex, args=("here", n), dedupe_key="burst", throttle=30
        )

    local = asyncio.gather(*(here(n) for n in range(30)))
    remote = go_and_collect(procs)
    ids = [*await local, *await remote]
    await finished(procs)
    [row] = await rows(pool, "burst")
    assert set(ids) == {row["job_id"]}
    assert row["dedupe_scope"] == "throttle"


async def test_throttle_allows_again_after_the_period(pool, make_scheduler):
    await make_scheduler()
    client = await make_scheduler(start=False)

    async def call(n: int) -> str:
        return await client.schedule(
            debounce_tasks.ping, args=(n,), dedupe_key="tick", throttle=timedelta(seconds=0.5)
        )

    first = await call(1)
    until = await pool.fetchval("SELECT until FROM scheduler_throttles WHERE throttle_key = 'tick'")
    n = 1
    while True:
        n += 1
        job_id = await call(n)
        if job_id != first:
            break
    assert await db_now(pool) >= until
    stored = await rows(pool, "tick")
    assert [r["job_id"] for r in stored] == [first, job_id]
    assert [args_of(r) for r in stored] == [[1], [n]]
    await wait_for_status(pool, job_id, "completed", timeout=10)
    await wait_for_status(pool, first, "completed", timeout=10)
    assert sorted(r[1][0] for r in debounce_tasks.runs) == [1, n]


async def test_the_vacuum_drops_ended_throttle_periods_only(pool, make_scheduler):
    client = await make_scheduler(start=False)
    held = await client.schedule(debounce_tasks.ping, dedupe_key="held", throttle=3600)
    await pool.execute(
        "INSERT INTO scheduler_throttles (throttle_key, job_id, until) VALUES"
        " ('ended', 'e1', clock_timestamp() - interval '2 minutes'),"
        " ('just-ended', 'e2', clock_timestamp() - interval '5 seconds')"
    )
    await client.run_vacuum()
    kept = await pool.fetch("SELECT throttle_key, job_id FROM scheduler_throttles ORDER BY 1")
    assert [tuple(r) for r in kept] == [("held", held), ("just-ended", "e2")]
    # The key's next call opens a new period as before.
    again = await client.schedule(debounce_tasks.ping, dedupe_key="ended", throttle=3600)
    assert again != "e1"
    assert (
        await pool.fetchval("SELECT job_id FROM scheduler_throttles WHERE throttle_key = 'ended'")
        == again
    )


# -- bad input and the caller's transaction ------------------------------------------


BAD_CALLS = [
    ({"debounce": 5}, ValueError, "dedupe_key"),
    ({"throttle": 5}, ValueError, "dedupe_key"),
    ({"debounce": 0, "dedupe_key": "k"}, ValueError, "debounce"),
    ({"debounce": -1.0, "dedupe_key": "k"}, ValueError, "debounce"),
    ({"debounce": "5s", "dedupe_key": "k"}, TypeError, "debounce"),
    ({"debounce": True, "dedupe_key": "k"}, TypeError, "debounce"),
    ({"throttle": timedelta(0), "dedupe_key": "k"}, ValueError, "throttle"),
    ({"throttle": float("inf"), "dedupe_key": "k"}, ValueError, "throttle"),
    ({"debounce": 5, "debounce_max_wait": 2, "dedupe_key": "k"}, ValueError, "max_wait"),
    ({"debounce_max_wait": 2, "dedupe_key": "k"}, ValueError, "needs debounce"),
    ({"debounce": 5, "throttle": 5, "dedupe_key": "k"}, ValueError, "not both"),
    ({"debounce": 5, "dedupe_key": "k", "delay": 3}, ValueError, "due time"),
    (
        {"debounce": 5, "dedupe_key": "k", "execution_time": datetime.now(UTC)},
        ValueError,
        "due time",
    ),
    ({"debounce": 5, "dedupe_key": "k", "dedupe_scope": "active"}, ValueError, "scope"),
    ({"throttle": 5, "dedupe_key": "k", "job_id": "mine"}, ValueError, "job_id"),
    ({"throttle": 5, "dedupe_key": "k", "depends_on": ["x"]}, ValueError, "depends_on"),
]


@pytest.mark.parametrize(("given", "error", "words"), BAD_CALLS)
async def test_bad_input_raises_at_the_call_and_writes_nothing(
    pool, make_scheduler, given, error, words
):
    client = await make_scheduler(start=False)
    await client.schedule(debounce_tasks.ping, dedupe_key="k", debounce=30)
    await client.schedule(debounce_tasks.ping, dedupe_key="t", throttle=30)
    before = await rows(pool)
    counted = await count(pool)
    with pytest.raises(error, match=words):
        await client.schedule(debounce_tasks.ping, args=(1,), **given)
    assert await count(pool) == counted
    assert [dict(r) for r in await rows(pool)] == [dict(r) for r in before]


def test_a_merge_that_is_not_callable_is_refused_at_the_decorator():
    from pg_scheduler import task

    async def body() -> None: ...

    with pytest.raises(TypeError, match="debounce_merge"):
        task(name="debounce.not_callable", debounce=1, debounce_merge="concat")(body)
    with pytest.raises(ValueError, match="max_wait"):
        task(name="debounce.short_wait", debounce=5, debounce_max_wait=1)(body)


async def test_schedule_bulk_refuses_debounce_and_throttle_and_writes_nothing(pool, make_scheduler):
    client = await make_scheduler(start=False)
    for spec in (
        JobSpec(debounce_tasks.ping, dedupe_key="k", debounce=5),
        JobSpec(debounce_tasks.ping, dedupe_key="k", throttle=5),
        JobSpec(debounce_tasks.by_default, args=(1,)),
    ):
        with pytest.raises(ValueError, match="schedule_bulk does not debounce"):
            await client.schedule_bulk([JobSpec(debounce_tasks.ping), spec])
        assert await count(pool) == 0


async def test_inside_the_callers_transaction_nothing_is_committed_for_it(pool, make_scheduler):
    client = await make_scheduler(start=False)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        first = await client.schedule(
            debounce_tasks.reindex, args=("t", 1), dedupe_key="k", debounce=30, connection=conn
        )
        again = await client.schedule(
            debounce_tasks.reindex, args=("t", 2), dedupe_key="k", debounce=30, connection=conn
        )
        won = await client.schedule(
            debounce_tasks.ping, dedupe_key="t", throttle=30, connection=conn
        )
        assert (
            await client.schedule(debounce_tasks.ping, dedupe_key="t", throttle=30, connection=conn)
            == won
        )
        assert first == again and conn.is_in_transaction()
        assert await count(pool) == 0  # not committed: invisible elsewhere
        await tx.rollback()
    assert await count(pool) == 0
    async with pool.acquire() as conn, conn.transaction():
        kept = await client.schedule(
            debounce_tasks.reindex, args=("t", 3), dedupe_key="k", debounce=30, connection=conn
        )
    [row] = await rows(pool, "k")
    assert row["job_id"] == kept and args_of(row) == ["t", 3]


async def test_plain_schedule_is_untouched(pool, make_scheduler):
    client = await make_scheduler(start=False)
    job_id = await client.schedule(debounce_tasks.ping, args=(1,))
    [row] = await rows(pool)
    assert row["job_id"] == job_id and row["dedupe_scope"] is None


async def test_sync_client_debounces_on_its_own_connection(pool, dsn):
    from pg_scheduler import SyncClient

    def calls() -> list[str]:
        with SyncClient(dsn) as client:
            return [
                client.schedule(
                    debounce_tasks.reindex, args=("sync", n), dedupe_key="s", debounce=30
                )
                for n in range(3)
            ]

    ids = await asyncio.to_thread(calls)
    assert len(set(ids)) == 1
    [row] = await rows(pool, "s")
    assert args_of(row) == ["sync", 2]


# -- the operator's view ---------------------------------------------------------------


def _cli(argv: list[str]) -> tuple[int, str]:
    from pg_scheduler.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


async def test_the_cli_shows_a_debounced_jobs_burst_and_due_time(
    pool, dsn, make_scheduler, monkeypatch
):
    from pg_scheduler.cli import ops

    monkeypatch.setattr(ops, "configure_logging", lambda args: None)
    client = await make_scheduler(start=False)
    job_id = await client.schedule(
        debounce_tasks.reindex, args=("cli", 1), dedupe_key="reindex:42", debounce=300
    )
    code, shown = await asyncio.to_thread(_cli, ["--dsn", dsn, "jobs", job_id])
    assert code == 0
    assert "reindex:42 (debounced: burst since" in shown and "unless another call" in shown
    code, data = await asyncio.to_thread(_cli, ["--dsn", dsn, "jobs", job_id, "--json"])
    job = json.loads(data)
    assert job["dedupe_scope"] == "debounce" and job["status"] == "pending"
    [row] = await rows(pool, "reindex:42")
    assert datetime.fromisoformat(job["execution_time"]) == row["execution_time"]


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
async def test_sync_client_on_the_callers_connection_never_ends_its_transaction(pool, dsn, driver):
    """Debounce (merged too) and throttle through a caller's DB-API connection:
    savepoints in its transaction; rolled back, nothing; committed, one job
    per burst and period."""
    module = pytest.importorskip(driver)
    from pg_scheduler import SyncClient

    def calls(commit: bool) -> tuple[list[str], list[str], list[str], bool]:
        conn = module.connect(dsn)
        try:
            with SyncClient(dsn) as client:
                burst = [
                    client.schedule(
                        debounce_tasks.reindex,
                        args=("db", n),
                        dedupe_key="k",
                        debounce=30,
                        connection=conn,
                    )
                    for n in range(3)
                ]
                merged = [
                    client.schedule(
                        debounce_tasks.collect,
                        kwargs={"ids": [n]},
                        dedupe_key="ids",
                        debounce=30,
                        connection=conn,
                    )
                    for n in range(3)
                ]
                period = [
                    client.schedule(
                        debounce_tasks.ping, args=(n,), dedupe_key="t", throttle=30, connection=conn
                    )
                    for n in range(3)
                ]
                open_still = conn.closed == 0 if driver == "psycopg2" else not conn.closed
                status = (
                    conn.get_transaction_status()
                    if driver == "psycopg2"
                    else conn.info.transaction_status
                )
                in_transaction = open_still and status == 2  # INTRANS: the caller's, not ended
            if commit:
                conn.commit()
            else:
                conn.rollback()
            return burst, merged, period, in_transaction
        finally:
            conn.close()

    burst, merged, period, in_transaction = await asyncio.to_thread(calls, False)
    assert in_transaction
    assert await count(pool) == 0
    burst, merged, period, in_transaction = await asyncio.to_thread(calls, True)
    assert in_transaction
    assert len(set(burst)) == len(set(merged)) == len(set(period)) == 1
    [row] = await rows(pool, "k")
    assert args_of(row) == ["db", 2] and row["job_id"] == burst[0]
    [row] = await rows(pool, "ids")
    assert kwargs_of(row) == {"ids": [0, 1, 2]}
    [row] = await rows(pool, "t")
    assert args_of(row) == [0] and row["dedupe_scope"] == "throttle"


async def test_a_debounced_or_throttled_job_keeps_its_concurrency_key(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    debounced = await scheduler.schedule(
        app_tasks.add,
        args=(1, 2),
        dedupe_key="keyed-debounce",
        debounce=60,
        concurrency_key="acct-1",
        max_running_per_key=1,
    )
    again = await scheduler.schedule(
        app_tasks.add,
        args=(3, 4),
        dedupe_key="keyed-debounce",
        debounce=60,
        concurrency_key="acct-1",
        max_running_per_key=1,
    )
    throttled = await scheduler.schedule(
        app_tasks.add,
        args=(1, 2),
        dedupe_key="keyed-throttle",
        throttle=60,
        concurrency_key="acct-2",
        rate_limit_per_key="5/s",
    )
    assert again == debounced
    rows = {
        r["job_id"]: r
        for r in await pool.fetch(
            "SELECT job_id, concurrency_key, max_running_per_key, rate_count_per_key"
            " FROM scheduled_jobs WHERE job_id = ANY($1::text[])",
            [debounced, throttled],
        )
    }
    assert tuple(rows[debounced])[1:] == ("acct-1", 1, None)
    assert tuple(rows[throttled])[1:] == ("acct-2", None, 5)
