"""Dedupe keys (migration 0008): at most one job per key and scope, under
races, in bulk and with every conflict policy, against real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from pg_scheduler import ConflictResolution, JobSpec, RetryPolicy, task
from pg_scheduler.store.migrate import migrate
from tests.support import dedupe_tasks
from tests.support.common import child_env, wait_for_status

RAISE, IGNORE, REPLACE = (
    ConflictResolution.RAISE,
    ConflictResolution.IGNORE,
    ConflictResolution.REPLACE,
)


def later(hours: float = 1) -> datetime:
    return datetime.now(UTC) + timedelta(hours=hours)


async def rows(pool, key: str | None = None) -> list:
    return await pool.fetch(
        "SELECT job_id, status, dedupe_key, dedupe_scope, task_data::text AS data, execution_time"
        " FROM scheduled_jobs WHERE $1::text IS NULL OR dedupe_key = $1 ORDER BY created_at",
        key,
    )


async def count(pool) -> int:
    return await pool.fetchval("SELECT count(*) FROM scheduled_jobs")


async def make_running(pool, job_id: str) -> None:
    """A claim as the engine writes it (status, worker, attempt, started_at)."""
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'running', worker_id = 'w', attempts = 1,"
        " started_at = now(), lease_until = now() + interval '1 hour' WHERE job_id = $1",
        job_id,
    )


# -- the race: two processes ----------------------------------------------------------

RACER = """
import asyncio, json, os, sys
from datetime import UTC, datetime, timedelta
import asyncpg
from pg_scheduler import ConflictResolution, Scheduler
from tests.support import dedupe_tasks

async def main():
    mode, first, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=8, max_size=8)
    scheduler = Scheduler(pool)  # never started: it only enqueues
    when = datetime.now(UTC) + timedelta(hours=1)
    conflict = ConflictResolution[mode]
    print("ready", flush=True)
    sys.stdin.readline()  # both start together

    async def one(n):
        try:
            return await scheduler.schedule(
                dedupe_tasks.noop, execution_time=when, args=(n,),
                dedupe_key=f"race:{n % 10}", conflict_resolution=conflict)
        except ValueError as exc:
            assert "race:" in str(exc), exc
            return None

    ids = await asyncio.gather(*(one(n) for n in range(first, first + total)))
    print(json.dumps(ids), flush=True)
    await pool.close()

asyncio.run(main())
"""


@pytest.mark.parametrize("mode", ["IGNORE", "RAISE", "REPLACE"])
async def test_two_processes_racing_1000_schedules_on_10_keys_leave_10_jobs(pool, dsn, mode):
    env = child_env(dsn)
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            RACER,
            mode,
            str(first),
            "500",
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for first in (0, 500)
    ]
    for p in procs:
        assert (await asyncio.wait_for(p.stdout.readline(), 60)).strip() == b"ready"
    for p in procs:
        p.stdin.write(b"go\n")
        await p.stdin.drain()
    results = []
    for p in procs:
        out, _ = await asyncio.wait_for(p.communicate(), 120)
        assert p.returncode == 0
        results.extend(json.loads(out.decode().strip().splitlines()[-1]))
    stored = await rows(pool)
    assert len(stored) == 10
    assert {r["status"] for r in stored} == {"pending"}
    assert sorted(r["dedupe_key"] for r in stored) == sorted(f"race:{k}" for k in range(10))
    ids = {r["job_id"] for r in stored}
    if mode != "RAISE":
        # Every call got the id of the one job holding its key.
        assert len(results) == 1000 and set(results) == ids
    else:
        assert sorted(r for r in results if r is not None) == sorted(ids)


# -- one schedule() per conflict policy ----------------------------------------------


async def test_raise_names_the_key_and_the_holder_and_writes_nothing(pool, make_scheduler):
    s = await make_scheduler(start=False)
    first = await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(1,), dedupe_key="k")
    with pytest.raises(ValueError) as info:
        await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(2,), dedupe_key="k")
    assert "'k'" in str(info.value) and first in str(info.value)
    assert [r["job_id"] for r in await rows(pool)] == [first]


async def test_ignore_returns_the_holder(pool, make_scheduler):
    s = await make_scheduler(start=False)
    first = await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(1,), dedupe_key="k")
    again = await s.schedule(
        dedupe_tasks.noop,
        execution_time=later(2),
        args=(2,),
        dedupe_key="k",
        conflict_resolution=IGNORE,
    )
    assert again == first
    [row] = await rows(pool)
    assert json.loads(row["data"])["args"] == [1]


async def test_replace_gives_the_pending_holder_the_new_fields(pool, make_scheduler):
    s = await make_scheduler(start=False)
    first = await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(1,), dedupe_key="k")
    when = later(5)
    again = await s.schedule(
        dedupe_tasks.noop,
        execution_time=when,
        args=(2,),
        dedupe_key="k",
        conflict_resolution=REPLACE,
    )
    assert again == first
    [row] = await rows(pool)
    assert json.loads(row["data"])["args"] == [2]
    assert row["execution_time"] == when


async def test_replace_never_touches_a_running_holder(pool, make_scheduler):
    s = await make_scheduler(start=False)
    first = await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(1,), dedupe_key="k")
    await make_running(pool, first)
    again = await s.schedule(
        dedupe_tasks.noop,
        execution_time=later(),
        args=(2,),
        dedupe_key="k",
        conflict_resolution=REPLACE,
    )
    assert again == first  # skipped: the running job's id
    [row] = await rows(pool)
    assert row["status"] == "running" and json.loads(row["data"])["args"] == [1]


# -- scopes ---------------------------------------------------------------------------


async def test_scope_active_a_running_job_blocks_the_key(pool, make_scheduler):
    s = await make_scheduler(start=False)
    first = await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(1,), dedupe_key="k")
    await make_running(pool, first)
    with pytest.raises(ValueError, match="running"):
        await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(2,), dedupe_key="k")
    assert await count(pool) == 1


async def test_scope_pending_one_waits_while_one_runs(pool, make_scheduler):
    s = await make_scheduler(start=False)

    async def sched(n: int, conflict=RAISE) -> str:
        return await s.schedule(
            dedupe_tasks.noop,
            execution_time=later(),
            args=(n,),
            dedupe_key="k",
            dedupe_scope="pending",
            conflict_resolution=conflict,
        )

    first = await sched(1)
    await make_running(pool, first)
    second = await sched(2)  # the running one does not hold the key
    assert second != first
    with pytest.raises(ValueError, match=second):
        await sched(3)
    assert await sched(4, IGNORE) == second
    assert await sched(5, REPLACE) == second
    stored = {r["job_id"]: r for r in await rows(pool)}
    assert len(stored) == 2 and stored[first]["status"] == "running"
    assert json.loads(stored[second]["data"])["args"] == [5]
    assert stored[second]["dedupe_scope"] == "pending"


async def test_scopes_are_separate_key_spaces(pool, make_scheduler):
    s = await make_scheduler(start=False)
    a = await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(1,), dedupe_key="k")
    p = await s.schedule(
        dedupe_tasks.noop,
        execution_time=later(),
        args=(2,),
        dedupe_key="k",
        dedupe_scope="pending",
    )
    assert a != p and await count(pool) == 2


async def test_finished_jobs_do_not_hold_the_key(pool, make_scheduler):
    s = await make_scheduler(start=False)
    ids = []
    for status in ("completed", "failed", "cancelled", "expired"):
        job_id = await s.schedule(
            dedupe_tasks.noop, execution_time=later(), args=(1,), dedupe_key="k"
        )
        assert await s.update_job_status(job_id, status)
        ids.append(job_id)
    fresh = await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(1,), dedupe_key="k")
    assert fresh not in ids and await count(pool) == 5


async def test_a_job_that_completes_frees_its_key(pool, make_scheduler):
    s = await make_scheduler()
    now = datetime.now(UTC)
    first = await s.schedule(dedupe_tasks.sync_customer, execution_time=now, args=(7,))
    await wait_for_status(pool, first, "completed")
    second = await s.schedule(dedupe_tasks.sync_customer, execution_time=later(), args=(7,))
    assert second != first
    job = await s.get_job(second)
    assert job is not None and job.dedupe_key == "sync:7" and job.dedupe_scope == "active"


async def test_scope_pending_a_retry_goes_back_beside_its_successor(pool, make_scheduler):
    """A started job no longer holds a "pending" key: its retry never collides."""
    dedupe_tasks.gate.clear()
    dedupe_tasks.gated_started.clear()
    dedupe_tasks.gated_runs.clear()
    s = await make_scheduler()
    first = await s.schedule(
        dedupe_tasks.gated,
        execution_time=datetime.now(UTC),
        args=(1,),
        max_retries=1,
        retry_policy=RetryPolicy(base_delay=0.05, jitter=0),
        dedupe_key="g",
        dedupe_scope="pending",
    )
    await asyncio.wait_for(dedupe_tasks.gated_started.wait(), 10)
    second = await s.schedule(
        dedupe_tasks.noop,
        execution_time=later(),
        args=(2,),
        dedupe_key="g",
        dedupe_scope="pending",
    )
    dedupe_tasks.gate.set()  # the first attempt fails and is retried
    await wait_for_status(pool, first, "completed")
    assert (await s.get_job(first)).retry_count == 1  # type: ignore[union-attr]
    assert (await s.get_job(second)).status.value == "pending"  # type: ignore[union-attr]


# -- job ids and keys together ------------------------------------------------------------


async def test_job_id_and_key_raise(pool, make_scheduler):
    s = await make_scheduler(start=False)
    holder = await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(1,), dedupe_key="k")
    with pytest.raises(ValueError, match=holder):  # id free, key held
        await s.schedule(dedupe_tasks.noop, execution_time=later(), job_id="mine", dedupe_key="k")
    await s.schedule(dedupe_tasks.noop, execution_time=later(), job_id="taken")
    with pytest.raises(ValueError, match="Job ID already exists"):  # id taken, key free
        await s.schedule(
            dedupe_tasks.noop, execution_time=later(), job_id="taken", dedupe_key="free"
        )
    assert sorted(r["job_id"] for r in await rows(pool)) == sorted([holder, "taken"])


async def test_job_id_and_key_ignore(pool, make_scheduler):
    s = await make_scheduler(start=False)
    holder = await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(1,), dedupe_key="k")
    await s.schedule(dedupe_tasks.noop, execution_time=later(), job_id="taken")

    async def sched(job_id: str, key: str) -> str:
        return await s.schedule(
            dedupe_tasks.noop,
            execution_time=later(),
            job_id=job_id,
            dedupe_key=key,
            conflict_resolution=IGNORE,
        )

    assert await sched("mine", "k") == holder  # id free, key held: the holder
    assert await sched("taken", "free") == "taken"  # id taken: that id, as for job ids
    assert await sched("taken", "k") == "taken"  # both: the id wins
    assert await count(pool) == 2


async def test_job_id_and_key_replace(pool, make_scheduler):
    s = await make_scheduler(start=False)
    holder = await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(1,), dedupe_key="k")

    async def sched(job_id: str, key: str, n: int) -> str:
        return await s.schedule(
            dedupe_tasks.noop,
            execution_time=later(),
            args=(n,),
            job_id=job_id,
            dedupe_key=key,
            conflict_resolution=REPLACE,
        )

    # Key held by a pending job: that job takes the fields and keeps its id.
    assert await sched("mine", "k", 2) == holder
    assert await count(pool) == 1
    # An existing (finished) id with a free key: REPLACE by job id, key and all.
    await s.schedule(dedupe_tasks.noop, execution_time=later(), job_id="old")
    await s.update_job_status("old", "completed")
    assert await sched("old", "other", 3) == "old"
    old = await s.get_job("old")
    assert old.status.value == "pending" and old.dedupe_key == "other"  # type: ignore[union-attr]
    # An existing id whose new key a running job holds: refused, nothing changes.
    await make_running(pool, holder)
    await s.update_job_status("old", "completed")
    with pytest.raises(ValueError, match=holder):
        await sched("old", "k", 4)
    assert (await s.get_job("old")).status.value == "completed"  # type: ignore[union-attr]


# -- bulk ------------------------------------------------------------------------------


async def test_bulk_in_batch_duplicates(pool, make_scheduler):
    s = await make_scheduler(start=False)
    specs = [
        JobSpec(dedupe_tasks.noop, later(), args=(n,), dedupe_key=f"b{n % 2}") for n in range(6)
    ]
    with pytest.raises(ValueError, match="repeated"):
        await s.schedule_bulk(specs, conflict_resolution=RAISE)
    assert await count(pool) == 0
    got = await s.schedule_bulk(specs, conflict_resolution=IGNORE, positional=True)
    assert got[0] and got[1] and got[2:] == [None] * 4  # the first of each key wins
    assert {json.loads(r["data"])["args"][0] for r in await rows(pool)} == {0, 1}
    # A second identical call: every key is held, nothing written, all None.
    assert await s.schedule_bulk(specs, conflict_resolution=IGNORE, positional=True) == [None] * 6
    assert await s.schedule_bulk(specs, conflict_resolution=IGNORE) == []
    # REPLACE: the last of each key wins, every entry is the holder's id.
    replaced = await s.schedule_bulk(specs, conflict_resolution=REPLACE)
    assert replaced == [got[0], got[1]] * 3
    assert {json.loads(r["data"])["args"][0] for r in await rows(pool)} == {4, 5}


async def test_bulk_large_with_keys_mixed_with_plain_rows(pool, make_scheduler):
    """Past the COPY threshold: keyed rows still get their conflict handling."""
    s = await make_scheduler(start=False)
    held = await s.schedule(dedupe_tasks.noop, execution_time=later(), args=(0,), dedupe_key="m0")
    specs = [
        JobSpec(dedupe_tasks.noop, later(), args=(n,), dedupe_key=f"m{n}" if n % 2 else None)
        for n in range(300)
    ] + [JobSpec(dedupe_tasks.noop, later(), args=(0,), dedupe_key="m0")]
    got = await s.schedule_bulk(specs, positional=True)
    assert got[-1] is None and all(got[:-1])
    assert await count(pool) == 301
    # RAISE with one held key: all or nothing.
    more = [JobSpec(dedupe_tasks.noop, later(), args=(n,)) for n in range(200)]
    more.append(JobSpec(dedupe_tasks.noop, later(), dedupe_key="m1"))
    with pytest.raises(ValueError, match="'m1'"):
        await s.schedule_bulk(more, conflict_resolution=RAISE)
    assert await count(pool) == 301
    assert held in {r["job_id"] for r in await rows(pool, "m0")}


async def test_bulk_takes_the_task_key_function(pool, make_scheduler):
    s = await make_scheduler(start=False)
    specs = [JobSpec(dedupe_tasks.sync_customer, later(), args=(n % 3,)) for n in range(9)]
    got = await s.schedule_bulk(specs)
    assert len(got) == 3
    assert sorted(r["dedupe_key"] for r in await rows(pool)) == ["sync:0", "sync:1", "sync:2"]


# -- key functions and bad input ---------------------------------------------------------


async def test_task_key_function_and_call_override(pool, make_scheduler):
    s = await make_scheduler(start=False)
    a = await s.schedule(dedupe_tasks.sync_customer, execution_time=later(), args=(1,))
    b = await s.schedule(
        dedupe_tasks.sync_customer,
        execution_time=later(),
        kwargs={"customer_id": 1, "full": True},
        conflict_resolution=IGNORE,
    )
    assert a == b  # the function saw the same customer either way
    c = await s.schedule(
        dedupe_tasks.sync_customer, execution_time=later(), args=(1,), dedupe_key="own"
    )
    assert c != a
    p = await s.schedule(dedupe_tasks.sync_pending, execution_time=later(), args=(1,))
    assert (await s.get_job(p)).dedupe_scope == "pending"  # type: ignore[union-attr]


async def test_bad_key_functions_write_nothing(pool, make_scheduler):
    s = await make_scheduler(start=False)
    with pytest.raises(ValueError, match="ZeroDivisionError"):
        await s.schedule(dedupe_tasks.bad_key, execution_time=later(), args=(0,))
    with pytest.raises(TypeError, match="must return a str"):
        await s.schedule(dedupe_tasks.int_key, execution_time=later(), args=(3,))
    with pytest.raises(ValueError, match="ZeroDivisionError"):
        await s.schedule_bulk([JobSpec(dedupe_tasks.bad_key, later(), args=(n,)) for n in (1, 0)])
    assert await count(pool) == 0


BAD_KEYS = [
    (123, TypeError),
    (b"bytes", TypeError),
    ("", ValueError),
    ("a\x00b", ValueError),
    ("\ud800", ValueError),
    ("x" * 1025, ValueError),
]


@pytest.mark.parametrize(("key", "error"), BAD_KEYS)
async def test_bad_keys_are_refused_everywhere(pool, make_scheduler, key, error):
    s = await make_scheduler(start=False)
    with pytest.raises(error, match="dedupe"):
        await s.schedule(dedupe_tasks.noop, execution_time=later(), dedupe_key=key)
    with pytest.raises(error, match="dedupe"):
        JobSpec(dedupe_tasks.noop, later(), dedupe_key=key)
    spec = JobSpec(dedupe_tasks.noop, later())
    spec.dedupe_key = key
    with pytest.raises(error, match="dedupe"):
        await s.schedule_bulk([JobSpec(dedupe_tasks.noop, later()), spec])
    with pytest.raises(error, match="dedupe"):
        await s.schedule_job("dedupe.noop", later(), {"args": [1]}, dedupe_key=key)
    with pytest.raises(error, match="dedupe"):

        @task(dedupe_key=key)
        async def never() -> None: ...

    assert await count(pool) == 0


async def test_bad_scopes_are_refused(pool, make_scheduler):
    s = await make_scheduler(start=False)
    with pytest.raises(ValueError, match="dedupe_scope"):
        await s.schedule(
            dedupe_tasks.noop, execution_time=later(), dedupe_key="k", dedupe_scope="running"
        )
    with pytest.raises(ValueError, match="without a dedupe_key"):
        await s.schedule(dedupe_tasks.noop, execution_time=later(), dedupe_scope="pending")
    with pytest.raises(ValueError, match="dedupe_scope"):
        JobSpec(dedupe_tasks.noop, later(), dedupe_key="k", dedupe_scope="all")
    assert await count(pool) == 0


async def test_schedule_job_takes_a_key(pool, make_scheduler):
    s = await make_scheduler(start=False)
    a = await s.schedule_job("dedupe.noop", later(), {"args": [1]}, dedupe_key="sj")
    b = await s.schedule_job(
        "dedupe.noop", later(), {"args": [2]}, conflict_resolution=IGNORE, dedupe_key="sj"
    )
    assert a == b and await count(pool) == 1


async def test_key_inside_the_callers_transaction(pool, make_scheduler):
    s = await make_scheduler(start=False)
    holder = await s.schedule(dedupe_tasks.noop, execution_time=later(), dedupe_key="tx")
    async with pool.acquire() as conn, conn.transaction():
        with pytest.raises(ValueError, match=holder):
            await s.schedule(
                dedupe_tasks.noop, execution_time=later(), dedupe_key="tx", connection=conn
            )
        # The caller's transaction is still usable.
        mine = await s.schedule(
            dedupe_tasks.noop, execution_time=later(), dedupe_key="tx2", connection=conn
        )
    assert {r["job_id"] for r in await rows(pool)} == {holder, mine}


async def test_forcing_a_finished_job_back_onto_a_held_key_changes_nothing(pool, make_scheduler):
    s = await make_scheduler(start=False)
    old = await s.schedule(dedupe_tasks.noop, execution_time=later(), dedupe_key="op")
    await s.update_job_status(old, "failed")
    holder = await s.schedule(dedupe_tasks.noop, execution_time=later(), dedupe_key="op")
    with pytest.raises(asyncpg.UniqueViolationError):
        await s.update_job_status(old, "pending")
    assert (await s.get_job(old)).status.value == "failed"  # type: ignore[union-attr]
    assert (await s.get_job(holder)).status.value == "pending"  # type: ignore[union-attr]


async def test_keys_in_another_schema(pool, make_scheduler):
    await migrate(pool, schema="dedupe_schema")
    s = await make_scheduler(start=False, schema="dedupe_schema")
    await pool.execute("TRUNCATE dedupe_schema.scheduled_jobs CASCADE")
    first = await s.schedule(dedupe_tasks.noop, execution_time=later(), dedupe_key="s")
    assert (
        await s.schedule(
            dedupe_tasks.noop,
            execution_time=later(),
            dedupe_key="s",
            conflict_resolution=REPLACE,
            args=(2,),
        )
        == first
    )
    with pytest.raises(ValueError, match=first):
        await s.schedule(dedupe_tasks.noop, execution_time=later(), dedupe_key="s")
    assert await pool.fetchval("SELECT count(*) FROM dedupe_schema.scheduled_jobs") == 1
    assert await count(pool) == 0  # nothing in public


async def test_the_cli_shows_a_jobs_key(pool, dsn, make_scheduler):
    s = await make_scheduler(start=False)
    job_id = await s.schedule(
        dedupe_tasks.noop, execution_time=later(), dedupe_key="cli:1", dedupe_scope="pending"
    )
    for extra in ([], ["--json"]):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pg_scheduler.cli",
            "--dsn",
            dsn,
            "jobs",
            job_id,
            *extra,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200"},
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0
        if extra:
            shown = json.loads(out)
            assert (shown["dedupe_key"], shown["dedupe_scope"]) == ("cli:1", "pending")
        else:
            assert "cli:1 (scope pending)" in out.decode()


async def test_bulk_replace_skips_a_running_holder_and_replaces_a_pending_one(pool, make_scheduler):
    s = await make_scheduler(start=False)
    running = await s.schedule(dedupe_tasks.noop, execution_time=later(), dedupe_key="r")
    await make_running(pool, running)
    pending = await s.schedule(dedupe_tasks.noop, execution_time=later(), dedupe_key="p")
    specs = [
        JobSpec(dedupe_tasks.noop, later(), args=(1,), dedupe_key="r"),
        JobSpec(dedupe_tasks.noop, later(), args=(2,), dedupe_key="p"),
        JobSpec(dedupe_tasks.noop, later(), args=(3,), dedupe_key="new"),
    ]
    got = await s.schedule_bulk(specs, conflict_resolution=REPLACE)
    assert got[:2] == [running, pending] and got[2] not in (running, pending)
    stored = {r["dedupe_key"]: r for r in await rows(pool)}
    assert stored["r"]["status"] == "running" and json.loads(stored["r"]["data"])["args"] == []
    assert json.loads(stored["p"]["data"])["args"] == [2]
    assert stored["new"]["job_id"] == got[2] and len(stored) == 3
