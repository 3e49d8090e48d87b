"""A completion or failure write the database does not take costs only its own row.

Thirty jobs finish together while another session holds row locks on four of
them (two that return, two that raise with ``max_retries=0``), and the
worker's statements are cut short by a ``statement_timeout``, a
``lock_timeout`` set for its pool, or ``pg_cancel_backend()`` of the blocked
backend. The completion batch holding a locked row is cancelled. Given up
whole, its rows would stay ``running`` with no owner, the heartbeat would hand
them back as claims that never started, and every job of the batch would run
again; a failure whose write was cancelled would crash the job's task the same
way, and a job with ``max_retries=0`` would run a second time.

So the batch is written apart: every row no one has locked at once, the
locked ones as soon as the lock is gone (their failures too). The job bodies
count their runs in a table of their own.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
import pytest

from pg_scheduler import Scheduler, task
from tests.support.common import wait_until

_state: dict[str, object] = {}

OK = [f"ok-{i}" for i in range(24)]
BAD = ["bad-0", "bad-1"]
LOCKED_OK = ["locked-ok-0", "locked-ok-1"]
LOCKED_BAD = ["locked-bad-0", "locked-bad-1"]
ALL = OK + BAD + LOCKED_OK + LOCKED_BAD


@task(name="faults.counted")
async def counted(key: str, fail: bool) -> str:
    db = _state["db"]
    assert isinstance(db, asyncpg.Pool)
    await db.execute("INSERT INTO completion_fault_runs (key) VALUES ($1)", key)
    gate = _state["gate"]
    assert isinstance(gate, asyncio.Event)
    await gate.wait()
    if fail:
        raise RuntimeError(f"{key} failed")
    return key


async def _runs(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch("SELECT key, count(*) AS n FROM completion_fault_runs GROUP BY key")
    return {r["key"]: r["n"] for r in rows}


async def _statuses(pool: asyncpg.Pool, ids: dict[str, str]) -> dict[str, str]:
    rows = await pool.fetch(
        "SELECT job_id, status FROM scheduled_jobs WHERE job_id = ANY($1::text[])",
        list(ids.values()),
    )
    by_id = {r["job_id"]: r["status"] for r in rows}
    return {key: by_id.get(job_id, "missing") for key, job_id in ids.items()}


@pytest.mark.parametrize("cut", ["statement_timeout", "lock_timeout", "pg_cancel_backend"])
async def test_a_locked_row_costs_only_itself(pool, dsn, make_scheduler, cut):
    await pool.execute(
        "CREATE TABLE IF NOT EXISTS completion_fault_runs (key text NOT NULL,"
        " at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )
    _state["db"] = pool
    _state["gate"] = gate = asyncio.Event()
    settings = {cut: "300"} if cut != "pg_cancel_backend" else {}
    worker_pool = await asyncpg.create_pool(dsn, min_size=2, max_size=20, server_settings=settings)
    try:
        # A lease far longer than the lock is held: no rescue is involved.
        scheduler = await make_scheduler(
            db_pool=worker_pool,
            max_concurrent_jobs=40,
            batch_claim_limit=40,
            lease_duration=120.0,
            heartbeat_threshold=120.0,
        )
        producer = Scheduler(pool)  # never started: it only enqueues
        now = datetime.now(UTC)
        ids = {
            key: await producer.schedule(
                counted,
                execution_time=now,
                kwargs={"key": key, "fail": key in BAD + LOCKED_BAD},
                max_retries=0,
            )
            for key in ALL
        }

        async def all_waiting() -> bool:
            return sum((await _runs(pool)).values()) == len(ALL) and len(
                scheduler.worker.executor.running
            ) == len(ALL)

        await wait_until(all_waiting, timeout=30, message="every job running")

        rival = await asyncpg.connect(dsn)
        try:
            tx = rival.transaction()
            await tx.start()
            await rival.execute(
                "SELECT 1 FROM scheduled_jobs WHERE job_id = ANY($1::text[]) FOR UPDATE",
                [ids[k] for k in LOCKED_OK],
            )
            await rival.execute(
                "SELECT 1 FROM scheduled_jobs WHERE job_id = ANY($1::text[]) FOR NO KEY UPDATE",
                [ids[k] for k in LOCKED_BAD],
            )
            gate.set()  # all thirty finish together
            innocent = {k: ids[k] for k in OK + BAD}

            async def innocents_written() -> bool:
                if cut == "pg_cancel_backend":
                    # Cancel whatever the worker has waiting for the locks.
                    await pool.execute(
                        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                        " AND pid <> $1",
                        rival.get_server_pid(),
                    )
                statuses = await _statuses(pool, innocent)
                return all(s in ("completed", "failed") for s in statuses.values())

            try:
                await wait_until(innocents_written, timeout=20, interval=0.1)
            except AssertionError:
                pass  # asserted below, with the run counts
            innocent_while_locked = await _statuses(pool, innocent)
            held_while_locked = await _statuses(pool, {k: ids[k] for k in LOCKED_OK + LOCKED_BAD})
            runs_while_locked = await _runs(pool)
            await tx.commit()
        finally:
            await rival.close()

        async def all_final() -> bool:
            statuses = await _statuses(pool, ids)
            return all(s in ("completed", "failed") for s in statuses.values())

        await wait_until(all_final, timeout=60, message="every job final")
        statuses = await _statuses(pool, ids)
        runs = await _runs(pool)
        await scheduler.shutdown()
    finally:
        await worker_pool.close()

    # While the rows were locked: the innocent batch-mates were written, the
    # locked jobs waited, still running, and nothing ran again.
    assert {k: n for k, n in runs_while_locked.items() if n != 1} == {}
    assert {
        k: s for k, s in innocent_while_locked.items() if s not in ("completed", "failed")
    } == {}
    assert set(held_while_locked.values()) == {"running"}
    # In the end every job ran exactly once and is recorded as it ended.
    assert {k: n for k, n in runs.items() if n != 1} == {}
    assert set(runs) == set(ALL)
    assert {k for k, s in statuses.items() if s == "completed"} == set(OK + LOCKED_OK)
    assert {k for k, s in statuses.items() if s == "failed"} == set(BAD + LOCKED_BAD)
    errors = await pool.fetch(
        "SELECT error_message FROM scheduled_jobs WHERE job_id = ANY($1::text[])",
        [ids[k] for k in BAD + LOCKED_BAD],
    )
    assert all(r["error_message"].startswith("RuntimeError: ") for r in errors)
