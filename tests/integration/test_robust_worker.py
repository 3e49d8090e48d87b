"""A robust worker: outcomes the database refuses, BaseException from
job code, and the bound on rows a worker holds. In-process schedulers on real
PostgreSQL."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from pg_scheduler import JobSpec, RetryPolicy, task
from pg_scheduler.engine import Completer
from pg_scheduler.store import Completion, Store
from pg_scheduler.support.codec import (
    ERROR_MAX_CHARS,
    RESULT_MAX_CHARS,
    TRACEBACK_MAX_CHARS,
    TRUNCATED_MARKER,
)
from tests.support.common import wait_until

runs: Counter[str] = Counter()
gate = asyncio.Event()

POISON_RESULTS = {
    "nul-result": lambda: {"text": "a\x00b"},
    "nul-key": lambda: {"a\x00": 1},
    "surrogate-result": lambda: ["x\ud800"],
    "big-result": lambda: "x" * (RESULT_MAX_CHARS + 10),
}
POISON_ERRORS = {
    "nul-error": lambda: ValueError("bad\x00byte"),
    "surrogate-error": lambda: ValueError("bad\ud800char"),
    "huge-error": lambda: ValueError("e" * 3_000_000),
}


@task(name="robust.outcome")
async def outcome(key: str, kind: str = "ok") -> object:
    runs[key] += 1
    await asyncio.sleep(0)
    if kind in POISON_RESULTS:
        return POISON_RESULTS[kind]()
    if kind in POISON_ERRORS:
        raise POISON_ERRORS[kind]()
    return key


@task(name="robust.base_exception")
async def base_exception(key: str, kind: str) -> None:
    runs[key] += 1
    if kind == "SystemExit":
        raise SystemExit(3)
    if kind == "sys.exit":
        sys.exit("bye")
    if kind == "KeyboardInterrupt":
        raise KeyboardInterrupt
    if kind == "GeneratorExit":
        raise GeneratorExit
    raise AssertionError(kind)


@task(name="robust.short")
async def short(key: str) -> None:
    runs[key] += 1
    await asyncio.sleep(0.002)


@task(name="robust.blocked")
async def blocked(key: str) -> None:
    runs[key] += 1
    await gate.wait()


def now() -> datetime:
    return datetime.now(UTC)


async def settled(pool, ids: list[str]) -> bool:
    left = await pool.fetchval(
        "SELECT count(*) FROM scheduled_jobs WHERE job_id = ANY($1::text[])"
        " AND status IN ('pending', 'running')",
        ids,
    )
    return left == 0


async def rows(pool, ids: list[str]) -> dict[str, dict]:
    found = await pool.fetch(
        """SELECT job_id, status, attempts, error_message, error_traceback, result::text AS result
             FROM scheduled_jobs WHERE job_id = ANY($1::text[])""",
        ids,
    )
    return {r["job_id"]: dict(r) for r in found}


# -- 1. poison outcomes ---------------------------------------------------------------


async def test_poison_outcomes_fail_once_and_innocent_jobs_complete_once(pool, make_scheduler):
    runs.clear()
    scheduler = await make_scheduler(start=False, max_concurrent_jobs=50, batch_claim_limit=50)
    kinds = [*POISON_RESULTS, *POISON_ERRORS]
    specs = [
        JobSpec(outcome, now(), kwargs={"key": f"ok{i}"}, job_id=f"ok{i}") for i in range(40)
    ] + [JobSpec(outcome, now(), kwargs={"key": k, "kind": k}, job_id=k) for k in kinds]
    await scheduler.schedule_bulk(specs)
    await scheduler.start()
    ids = [s.job_id for s in specs]
    await wait_until(lambda: settled(pool, ids), timeout=30, message="every job settled")
    found = await rows(pool, ids)
    for i in range(40):
        row = found[f"ok{i}"]
        assert (row["status"], row["attempts"], row["result"]) == ("completed", 1, f'"ok{i}"')
    for kind in kinds:
        assert found[kind]["status"] == "failed", (kind, found[kind])
        assert found[kind]["attempts"] == 1
    assert found["nul-result"]["error_message"].startswith(
        "result not stored: it contains a NUL character"
    )
    assert "NUL" in found["nul-key"]["error_message"]
    assert "lone surrogate" in found["surrogate-result"]["error_message"]
    assert "over the 1,000,000-character limit" in found["big-result"]["error_message"]
    assert found["nul-error"]["error_message"] == "ValueError: bad\\x00byte"
    assert found["surrogate-error"]["error_message"] == "ValueError: bad\\ud800char"
    assert "Traceback" in found["nul-error"]["error_traceback"]
    huge = found["huge-error"]["error_message"]
    assert len(huge) <= ERROR_MAX_CHARS
    assert huge.endswith(TRUNCATED_MARKER.format(3_000_000 + len("ValueError: ") - 9_920))
    assert len(found["huge-error"]["error_traceback"]) <= TRACEBACK_MAX_CHARS
    # Every job ran exactly once: no poison loop, no innocent re-runs.
    assert runs == Counter({key: 1 for key in ids})
    await wait_until(lambda: scheduler.worker.in_flight == 0, message="slots freed")


async def test_failure_text_with_nul_is_retried_then_failed(pool, make_scheduler):
    runs.clear()
    scheduler = await make_scheduler(retry_policy=RetryPolicy(base_delay=0, jitter=0))
    job_id = await scheduler.schedule(
        outcome,
        execution_time=now(),
        kwargs={"key": "retried", "kind": "nul-error"},
        max_retries=2,
    )
    await wait_until(lambda: settled(pool, [job_id]), timeout=20, message="job settled")
    row = (await rows(pool, [job_id]))[job_id]
    assert (row["status"], row["attempts"]) == ("failed", 3)
    assert row["error_message"] == "ValueError: bad\\x00byte"
    assert runs["retried"] == 3


async def test_a_refused_completion_is_isolated_from_its_batch(pool, make_scheduler):
    """The group commit itself: one batch with refused results writes the good
    rows and records the bad ones failed, each with its reason."""
    producer = await make_scheduler(start=False)
    ids = [
        await producer.schedule(short, execution_time=now(), kwargs={"key": f"b{i}"})
        for i in range(12)
    ]
    store = Store(pool)
    claimed = await store.claim("w-iso", ["robust.short"], 100, 30.0)
    assert {r["job_id"] for r in claimed} == set(ids)
    results = {ids[i]: f"[{i}]" for i in range(12)}
    results[ids[3]] = '{"a": "x\\u0000y"}'  # NUL
    results[ids[7]] = '"\\ud800"'  # a lone surrogate
    results[ids[9]] = '{"a": 1'  # not even JSON
    batcher = Completer(store, "w-iso", lambda: False)
    try:
        answers = await asyncio.gather(
            *(batcher.submit(Completion(job_id, 1, results[job_id])) for job_id in ids)
        )
    finally:
        await batcher.connection.release()
    by_id = dict(zip(ids, answers, strict=True))
    found = await rows(pool, ids)
    for i, job_id in enumerate(ids):
        if i in (3, 7, 9):
            assert isinstance(by_id[job_id], str) and by_id[job_id].startswith("result not stored")
            assert found[job_id]["status"] == "failed"
            assert found[job_id]["error_message"] == by_id[job_id]
        else:
            assert by_id[job_id] is True
            assert (found[job_id]["status"], found[job_id]["result"]) == ("completed", f"[{i}]")
    assert "NUL" in found[ids[3]]["error_message"]
    assert "lone surrogate" in found[ids[7]]["error_message"]
    assert "not valid JSON" in found[ids[9]]["error_message"]


# -- 2. BaseException from job code ----------------------------------------------------


@pytest.mark.parametrize("kind", ["SystemExit", "sys.exit", "KeyboardInterrupt", "GeneratorExit"])
async def test_base_exception_fails_the_attempt_and_the_worker_keeps_serving(
    pool, make_scheduler, kind
):
    runs.clear()
    scheduler = await make_scheduler(retry_policy=RetryPolicy(base_delay=0, jitter=0))
    once = await scheduler.schedule(
        base_exception, execution_time=now(), kwargs={"key": "once", "kind": kind}
    )
    twice = await scheduler.schedule(
        base_exception, execution_time=now(), kwargs={"key": "twice", "kind": kind}, max_retries=1
    )
    await wait_until(lambda: settled(pool, [once, twice]), timeout=20, message="jobs settled")
    found = await rows(pool, [once, twice])
    expected = {"sys.exit": "SystemExit: bye", "SystemExit": "SystemExit: 3"}.get(kind, kind)
    for job_id, attempts in ((once, 1), (twice, 2)):
        assert found[job_id]["status"] == "failed"
        assert found[job_id]["attempts"] == attempts
        assert found[job_id]["error_message"].startswith(expected)
    assert runs == Counter({"once": 1, "twice": 2})
    # The worker still heartbeats and runs jobs.
    seen = await pool.fetchval(
        "SELECT last_seen FROM scheduler_workers WHERE worker_id = $1", scheduler.worker_id
    )
    after = await scheduler.schedule(short, execution_time=now(), kwargs={"key": "after"})
    await wait_until(lambda: settled(pool, [after]), timeout=10, message="a later job ran")
    assert (await rows(pool, [after]))[after]["status"] == "completed"

    async def heartbeat_moved() -> bool:
        latest = await pool.fetchval(
            "SELECT last_seen FROM scheduler_workers WHERE worker_id = $1", scheduler.worker_id
        )
        return latest is not None and latest > seen

    await wait_until(heartbeat_moved, timeout=10, message="a later heartbeat")
    assert not scheduler._lifecycle.claim_task.done()
    await wait_until(lambda: scheduler.worker.in_flight == 0, message="slots freed")


# -- 5. the bound on rows held ---------------------------------------------------------


async def test_a_worker_never_holds_more_than_concurrency_plus_two_batches(pool, make_scheduler):
    runs.clear()
    scheduler = await make_scheduler(start=False, max_concurrent_jobs=10, batch_claim_limit=10)
    ids = await scheduler.schedule_bulk(
        [JobSpec(short, now(), kwargs={"key": f"d{i}"}) for i in range(500)]
    )
    done = asyncio.Event()
    peak = 0

    async def sample() -> None:
        nonlocal peak
        async with pool.acquire() as conn:
            while not done.is_set():
                held = await conn.fetchval(
                    "SELECT count(*) FROM scheduled_jobs WHERE worker_id = $1"
                    " AND status = 'running'",
                    scheduler.worker_id,
                )
                peak = max(peak, held)

    sampler = asyncio.create_task(sample())
    await scheduler.start()
    try:
        await wait_until(lambda: settled(pool, ids), timeout=60, message="500 jobs drained")
    finally:
        done.set()
        await sampler
    # max_concurrent_jobs + one batch claimed ahead + one batch whose completion
    # is being written (docs/failure-model.md: How many jobs a worker holds).
    assert 0 < peak <= 30, peak
    assert set(runs.values()) == {1} and len(runs) == 500
    worker = scheduler.worker
    await wait_until(lambda: worker.in_flight == 0, message="nothing in flight")
    assert worker.slots.active == 0 and not worker.slots.taken and not worker.state.owned


async def test_a_second_worker_joining_a_busy_one_gets_work(pool, make_scheduler):
    runs.clear()
    gate.clear()
    first = await make_scheduler(max_concurrent_jobs=10, batch_claim_limit=10)
    ids = await first.schedule_bulk(
        [JobSpec(blocked, now(), kwargs={"key": f"g{i}"}) for i in range(60)]
    )

    async def held_by(worker_id: str) -> int:
        return await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE worker_id = $1 AND status = 'running'",
            worker_id,
        )

    try:
        await wait_until(lambda: len(runs) == 10, message="the first worker is busy")
        assert await held_by(first.worker_id) <= 30
        second = await make_scheduler(max_concurrent_jobs=10, batch_claim_limit=10)
        await wait_until(lambda: len(runs) == 20, timeout=15, message="the second worker runs jobs")
        assert await held_by(second.worker_id) >= 10
        assert await held_by(first.worker_id) <= 30
    finally:
        gate.set()
    await wait_until(lambda: settled(pool, ids), timeout=30, message="all jobs done")
    assert set(runs.values()) == {1}


# -- 5. rescues count only jobs that started ---------------------------------------------


async def test_rescue_counts_only_jobs_that_started(pool, make_scheduler):
    """Workers that die holding a job claimed ahead (never started) do not use up its
    max_rescues; a cap on such rescues still ends a job that kills every worker."""
    producer = await make_scheduler(start=False)
    base = await pool.fetchval("SELECT now()")
    ids = [
        await producer.schedule(
            short, execution_time=base - timedelta(seconds=60 - i), kwargs={"key": f"r{i}"}
        )
        for i in range(4)
    ]
    started, ahead = ids[:2], ids[2:]
    store = Store(pool)

    async def die_holding(worker_id: str, start_now: int, reported: list[str] = ()) -> list:
        claimed = await store.claim(worker_id, ["robust.short"], 4, 0.0, start_now=start_now)
        if reported:  # its last heartbeat said these had started
            await store.heartbeat(worker_id, 0.0, "h", 1, 2, ["robust.short"], reported)
        await wait_until(
            lambda: pool.fetchval(
                "SELECT bool_and(lease_until < now()) FROM scheduled_jobs WHERE worker_id = $1"
                " AND status = 'running'",
                worker_id,
            ),
            message="leases expired",
        )
        rescued = await store.rescue_orphans(60.0, 1, 3)
        assert {r["job_id"] for r in rescued} == {r["job_id"] for r in claimed}
        return claimed

    claimed = await die_holding("dead-1", start_now=2)
    assert {r["job_id"] for r in claimed if r["claimed_ahead"]} == set(ahead)
    found = await pool.fetch(
        "SELECT job_id, status, rescue_count, unstarted_rescues, error_message"
        " FROM scheduled_jobs WHERE job_id = ANY($1::text[])",
        ids,
    )
    by_id = {r["job_id"]: r for r in found}
    for job_id in started:
        assert (by_id[job_id]["rescue_count"], by_id[job_id]["unstarted_rescues"]) == (1, 0)
    for job_id in ahead:
        assert (by_id[job_id]["rescue_count"], by_id[job_id]["unstarted_rescues"]) == (0, 1)
        # A pending row has no current error; the rescue is in its history.
        assert by_id[job_id]["error_message"] is None
        history = await pool.fetchval(
            "SELECT error FROM job_attempts WHERE job_id = $1 AND outcome = 'rescued'", job_id
        )
        assert "before it started" in history

    # ids[2] started after the claim and the heartbeat said so: it counts.
    await die_holding("dead-2", start_now=2, reported=[ids[2]])
    statuses = dict(
        await pool.fetch(
            "SELECT job_id, status FROM scheduled_jobs WHERE job_id = ANY($1::text[])", ids
        )
    )
    assert [statuses[i] for i in ids] == ["failed", "failed", "pending", "pending"]
    counts = await pool.fetch(
        "SELECT job_id, rescue_count, unstarted_rescues FROM scheduled_jobs"
        " WHERE job_id = ANY($1::text[])",
        ahead,
    )
    assert {r["job_id"]: (r["rescue_count"], r["unstarted_rescues"]) for r in counts} == {
        ids[2]: (1, 1),
        ids[3]: (0, 2),
    }
    # ids[3] never started: one more death keeps it, the next passes the cap (3).
    await die_holding("dead-3", start_now=0)
    assert await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", ids[3]) == (
        "pending"
    )
    await die_holding("dead-4", start_now=0)
    row = await pool.fetchrow(
        "SELECT status, rescue_count, unstarted_rescues, error_message FROM scheduled_jobs"
        " WHERE job_id = $1",
        ids[3],
    )
    assert (row["status"], row["rescue_count"], row["unstarted_rescues"]) == ("failed", 0, 4)
    assert row["error_message"].startswith("gave up: the workers holding this job")


async def test_worker_marks_exactly_its_buffered_rows_claimed_ahead(pool, make_scheduler):
    runs.clear()
    gate.clear()
    scheduler = await make_scheduler(start=False, max_concurrent_jobs=2, batch_claim_limit=4)
    scheduler.worker.handback.max_buffer_wait = 60.0  # keep the buffer while the test looks at it
    ids = await scheduler.schedule_bulk(
        [JobSpec(blocked, now(), kwargs={"key": f"m{i}"}) for i in range(4)]
    )
    await scheduler.start()

    async def marked() -> set[str]:
        found = await pool.fetch(
            "SELECT job_id FROM scheduled_jobs WHERE status = 'running' AND claimed_ahead"
        )
        return {r["job_id"] for r in found}

    try:
        await wait_until(lambda: len(runs) == 2, message="two jobs running")
        buffered = {row["job_id"] for _, row in scheduler.worker.slots.buffer}
        assert len(buffered) == 2
        assert await marked() == buffered
    finally:
        gate.set()
    await wait_until(lambda: len(runs) == 4, message="the buffered jobs started")
    await wait_until(lambda: settled(pool, ids), message="all done")
    assert set(runs.values()) == {1}
