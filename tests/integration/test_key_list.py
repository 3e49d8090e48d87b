"""The keyed claim that visits a list of keys (many keys; engine/keyed.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import asyncpg

from pg_scheduler import JobSpec
from pg_scheduler.engine import keyed
from tests.support import key_tasks
from tests.support.key_runs import finished, spans_by_key
from tests.support.spans import max_overlap

STEP = "keys.step"


async def _keys(scheduler, keys: int, per_key: int, **limits) -> None:
    when = datetime.now(UTC) - timedelta(seconds=1)
    await scheduler.schedule_bulk(
        [
            JobSpec(
                key_tasks.step,
                when + timedelta(milliseconds=k),  # the list's order: k0000 first
                (f"k{k:04d}", n),
                concurrency_key=f"k{k:04d}",
                **limits,
            )
            for n in range(per_key)
            for k in range(keys)
        ]
    )


async def _hold(pool: asyncpg.Pool, keys: list[str]) -> None:
    """One running job of each of ``keys``, as another worker's (a live lease)."""
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'running', worker_id = 'elsewhere', attempts = 1,"
        " started_at = now(), lease_until = now() + interval '1 hour'"
        " WHERE job_id IN (SELECT DISTINCT ON (concurrency_key) job_id FROM scheduled_jobs"
        "                   WHERE concurrency_key = ANY($1::text[])"
        "                   ORDER BY concurrency_key, execution_time)",
        keys,
    )


async def _claim(pool: asyncpg.Pool, scheduler, listed, room: int):
    store = scheduler.worker.keyed.store
    async with pool.acquire() as conn:
        return await store.claim(
            conn,
            limit=room,
            tasks=[STEP],
            queues=None,
            worker_id="here",
            lease_seconds=60,
            cut=False,
            listed=listed,
            visit=room + 2,
        )


async def test_a_listed_claim_passes_over_keys_at_their_limit_in_one_claim(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    await _keys(scheduler, 150, 2, max_running_per_key=1)
    listed = await scheduler.worker.keyed.store.key_list(pool, 1000)
    assert [k.key for k in listed] == [f"k{k:04d}" for k in range(150)]
    assert all(k.most == 1 for k in listed)
    # The first 100 keys of the list are at their limit (held elsewhere).
    await _hold(pool, [k.key for k in listed[:100]])
    claim = await _claim(pool, scheduler, listed, 10)
    taken = sorted(r["claimed_key"] for r in claim.rows)
    # One claim took ten rows, one per key, all past the held keys, in list order.
    assert taken == [k.key for k in listed[100:110]]
    assert claim.reach == 112  # went through the held keys and the 12 it visited
    running = await pool.fetch(
        "SELECT concurrency_key, count(*) AS n FROM scheduled_jobs WHERE status = 'running'"
        " GROUP BY 1 HAVING count(*) > 1"
    )
    assert running == []


async def test_a_listed_claim_holds_each_row_to_its_limit_whatever_the_list_said(
    pool, make_scheduler
):
    """The list's limits only choose which keys to lock: a key whose head
    changed since (a stricter job enqueued ahead) is held to the rows' own."""
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    await _keys(scheduler, 120, 3, max_running_per_key=3)
    listed = await scheduler.worker.keyed.store.key_list(pool, 1000)
    assert all(k.most == 3 for k in listed)
    await pool.execute("UPDATE scheduled_jobs SET max_running_per_key = 1")
    claim = await _claim(pool, scheduler, listed, 50)
    per_key = {}
    for r in claim.rows:
        per_key[r["claimed_key"]] = per_key.get(r["claimed_key"], 0) + 1
    assert claim.rows and set(per_key.values()) == {1}


async def test_a_listed_claim_passes_over_keys_whose_rate_is_used(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    await _keys(scheduler, 110, 2, rate_limit_per_key="1/m")
    listed = await scheduler.worker.keyed.store.key_list(pool, 1000)
    assert all((k.rate_count, k.rate_period) == (1, 60.0) for k in listed)
    used = [k.key for k in listed[:100]]
    await pool.execute(
        "INSERT INTO scheduler_key_starts (concurrency_key, started_at)"
        " SELECT k, clock_timestamp() FROM unnest($1::text[]) AS k",
        used,
    )
    claim = await _claim(pool, scheduler, listed, 5)
    assert sorted(r["claimed_key"] for r in claim.rows) == [k.key for k in listed[100:105]]


async def test_claims_visit_the_list_again_from_its_start_until_it_is_read_again(
    pool, make_scheduler, runs, monkeypatch
):
    """The list is read about once a second, not each time the claims reach
    its end: in between they go round it again."""
    monkeypatch.setattr(keyed, "LIST_TTL", 3600.0)
    scheduler = await make_scheduler(start=False, max_concurrent_jobs=20, batch_claim_limit=20)
    await scheduler.initialize_db()
    store = scheduler.worker.keyed.store
    lists = 0
    real = store.key_list

    async def key_list(*args, **kwargs):
        nonlocal lists
        lists += 1
        return await real(*args, **kwargs)

    store.key_list = key_list
    keys = keyed.LIST_MIN + 20
    await _keys(scheduler, keys, 3, max_running_per_key=1)
    await scheduler.start()
    await finished(pool, keys * 3, timeout=60)
    # Three rounds of the keys (a job of each key per round) and one read of the list.
    assert lists == 1
    by_key = await spans_by_key(pool)
    assert len(by_key) == keys and all(len(v) == 3 for v in by_key.values())
    assert max(max_overlap(v) for v in by_key.values()) == 1


async def test_a_listed_claim_starts_only_the_oldest_job_of_an_ordered_key(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    when = datetime.now(UTC) - timedelta(seconds=1)
    await _keys(scheduler, 110, 1, max_running_per_key=1)
    # Three ordered keys with three jobs each, the newest the most urgent.
    await scheduler.schedule_bulk(
        [
            JobSpec(
                key_tasks.step,
                when - timedelta(milliseconds=n),
                (f"o{k}", n),
                concurrency_key=f"o{k}",
                ordered=True,
            )
            for k in range(3)
            for n in range(3)
        ]
    )
    listed = await scheduler.worker.keyed.store.key_list(pool, 1000)
    assert {k.key for k in listed if k.ordered} == {"o0", "o1", "o2"}
    assert not any(k.ordered for k in listed if k.key.startswith("k"))
    claim = await _claim(pool, scheduler, listed, 50)
    started = await pool.fetch(
        "SELECT concurrency_key AS key, task_data FROM scheduled_jobs"
        " WHERE status = 'running' AND concurrency_key LIKE 'o%' ORDER BY 1"
    )
    # One each, the first enqueued (n = 0), not the most urgent.
    assert [r["key"] for r in started] == ["o0", "o1", "o2"]
    args = [json.loads(r["task_data"])["args"] for r in started]
    assert args == [["o0", 0], ["o1", 0], ["o2", 0]]
    assert len(claim.rows) == 50


async def test_a_listed_claim_locks_no_key_of_tasks_it_does_not_run(pool, make_scheduler):
    """Keys whose work is another worker's tasks are passed over, not locked
    (that worker's claims would pass them over while they are held); a key
    with a job of this worker's tasks behind another task's is still served."""
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    when = datetime.now(UTC) - timedelta(seconds=1)
    await _keys(scheduler, 110, 1, max_running_per_key=1)
    # The 100 most urgent keys hold only jobs of a task this worker does not run.
    await pool.execute(
        "UPDATE scheduled_jobs SET task_name = 'elsewhere.task' WHERE concurrency_key < 'k0100'"
    )
    # Key k0000 also has one of ours, behind the other task's job.
    await scheduler.schedule(
        key_tasks.step,
        args=("k0000", 1),
        execution_time=when + timedelta(microseconds=500),
        concurrency_key="k0000",
        max_running_per_key=1,
    )
    listed = await scheduler.worker.keyed.store.key_list(pool, 1000)
    assert listed[0].key == "k0000" and listed[0].task == "elsewhere.task"
    claim = await _claim(pool, scheduler, listed, 5)
    taken = sorted(r["claimed_key"] for r in claim.rows)
    assert taken == ["k0000", "k0100", "k0101", "k0102", "k0103"]
    # It went through the 99 keys of the other task to lock 7 (k0000, k0100 to
    # k0105): it locked none of them, or it would have stopped at the 7th key.
    assert claim.reach == 106
