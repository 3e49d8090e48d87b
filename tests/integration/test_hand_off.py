"""A completion takes over the dependents it releases (migration 0023,
engine/hand_off.py): in the same statement, a dependent the completing
worker's plain claim would take is written running for it and started there,
in the slot its dependency left; every other released dependent is pending,
for any worker's claim, as before."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from pg_scheduler import JobPriority, JobSpec, PollingConfig, Scheduler, chain, task
from pg_scheduler.store import Completion, HandOffRoom
from tests.support import dependency_tasks as t
from tests.support.common import wait_until

WORKER = "w-hand-off"


@pytest.fixture(autouse=True)
async def runs_table(pool: asyncpg.Pool) -> None:
    await t.fresh_runs(pool)


@task(name="hand_off.other")
async def other() -> None:
    """A task no room below names."""


def _now() -> datetime:
    return datetime.now(UTC) - timedelta(seconds=1)


def _room(**changes: Any) -> HandOffRoom:
    fields: dict[str, Any] = dict(
        tasks=["dep.step"], queues=None, most=10, start_now=10, lease_seconds=30.0
    )
    fields.update(changes)
    return HandOffRoom(**fields)


async def _running(pool: asyncpg.Pool, job_id: str, worker: str = WORKER) -> Completion:
    """``job_id`` made ``worker``'s running attempt (as its claim would)."""
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'running', worker_id = $2, attempts = 1,"
        " started_at = now(), lease_until = now() + interval '1 hour' WHERE job_id = $1",
        job_id,
        worker,
    )
    return Completion(job_id, 1, None, True)


async def _complete(
    pool: asyncpg.Pool, job_id: str, room: HandOffRoom
) -> tuple[set[str], list[asyncpg.Record]]:
    store = Scheduler(pool).store
    done = await _running(pool, job_id)
    return await store.complete_handing(WORKER, [done], room)


async def _status(pool: asyncpg.Pool, job_id: str) -> asyncpg.Record:
    return await pool.fetchrow(
        "SELECT status, worker_id, attempts, claimed_ahead, started_at, lease_until"
        " FROM scheduled_jobs WHERE job_id = $1",
        job_id,
    )


async def _edge(pool: asyncpg.Pool, **dependent: Any) -> tuple[str, str]:
    """A due dependency and one dependent (``dependent``: its JobSpec options)."""
    first = JobSpec(t.step, _now(), ("first",))
    then = JobSpec(
        dependent.pop("func", t.step),
        dependent.pop("when", _now()),
        ("then",),
        depends_on=[first],
        **dependent,
    )
    ids = await Scheduler(pool).schedule_bulk([first, then])
    return ids[0], ids[1]


async def test_a_released_dependent_is_written_running_for_the_completing_worker(pool):
    first, then = await _edge(pool)
    written, handed = await _complete(pool, first, _room(start_now=1))
    assert written == {first}
    assert [r["job_id"] for r in handed] == [then]
    (row,) = handed
    assert (row["status"], row["attempts"], row["claimed_ahead"]) == ("running", 1, False)
    assert row["task_name"] == "dep.step" and row["has_dependents"] is False
    now = await _status(pool, then)
    assert (now["status"], now["worker_id"], now["attempts"]) == ("running", WORKER, 1)
    assert now["lease_until"] > now["started_at"]
    finished = await pool.fetchval(
        "SELECT finished_at FROM scheduled_jobs WHERE job_id = $1", first
    )
    assert now["started_at"] == finished  # the same transaction


async def test_past_the_room_dependents_stay_pending_and_past_start_now_are_claimed_ahead(pool):
    root = JobSpec(t.step, _now(), ("root",))
    fan = [JobSpec(t.step, _now(), (f"leaf{i}",), depends_on=[root]) for i in range(5)]
    ids = await Scheduler(pool).schedule_bulk([root, *fan])
    written, handed = await _complete(pool, ids[0], _room(most=2, start_now=1))
    assert written == {ids[0]}
    assert len(handed) == 2
    assert sorted(r["claimed_ahead"] for r in handed) == [False, True]
    statuses = await pool.fetch(
        "SELECT status, count(*) FROM scheduled_jobs WHERE job_id = ANY($1::text[]) GROUP BY 1",
        ids[1:],
    )
    assert dict(map(tuple, statuses)) == {"running": 2, "pending": 3}


@pytest.mark.parametrize(
    "setup, room",
    [
        pytest.param({}, _room(tasks=["hand_off.other"]), id="task-not-run-here"),
        pytest.param({"queue": "elsewhere"}, _room(queues=["default"]), id="queue-not-served"),
        pytest.param({"when": datetime.now(UTC) + timedelta(hours=1)}, _room(), id="not-due"),
        pytest.param({"concurrency_key": "k", "max_running_per_key": 1}, _room(), id="keyed"),
        pytest.param({"fair_share_key": "tenant"}, _room(), id="fair-share"),
        pytest.param({}, _room(most=0), id="no-room"),
    ],
)
async def test_a_dependent_the_worker_would_not_claim_is_released_pending(pool, dsn, setup, room):
    """Released pending, and its queue's workers woken at the commit (a NOTIFY
    on the queue's channel), though the statement took nothing over."""
    first, then = await _edge(pool, **setup)
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(dsn)
    await listener.add_listener("pg_scheduler_jobs", lambda *args: heard.put_nowait(args[3]))
    try:
        written, handed = await _complete(pool, first, room)
        assert written == {first} and handed == []
        assert (await _status(pool, then))["status"] == "pending"
        queue = setup.get("queue", "default")
        assert await asyncio.wait_for(heard.get(), 5) == ("" if queue == "default" else queue)
    finally:
        await listener.close()


async def test_a_dependent_of_a_paused_queue_or_a_limited_task_is_released_pending(pool):
    first, then = await _edge(pool, queue="paused")
    await Scheduler(pool).pause_queue("paused")
    try:
        assert (await _complete(pool, first, _room()))[1] == []
        assert (await _status(pool, then))["status"] == "pending"
    finally:
        await Scheduler(pool).resume_queue("paused")

    await pool.execute("TRUNCATE scheduled_jobs CASCADE")
    first, then = await _edge(pool)
    await pool.execute(
        "INSERT INTO scheduler_limits (scope, name, max_running) VALUES ('task', 'dep.step', 5)"
    )
    try:
        assert (await _complete(pool, first, _room()))[1] == []
        assert (await _status(pool, then))["status"] == "pending"
    finally:
        await pool.execute("DELETE FROM scheduler_limits")


async def test_more_urgent_due_work_keeps_the_dependent_pending_equal_work_does_not(pool):
    producer = Scheduler(pool)
    first, then = await _edge(pool, priority=JobPriority.NORMAL)
    urgent = await producer.schedule(t.step, args=("urgent",), priority=JobPriority.CRITICAL)
    assert (await _complete(pool, first, _room()))[1] == []
    assert (await _status(pool, then))["status"] == "pending"

    await pool.execute("DELETE FROM scheduled_jobs WHERE job_id = ANY($1::text[])", [then, urgent])
    first, then = await _edge(pool, priority=JobPriority.NORMAL)
    await producer.schedule(t.step, args=("as urgent",), priority=JobPriority.NORMAL)
    handed = (await _complete(pool, first, _room()))[1]
    assert [r["job_id"] for r in handed] == [then]


async def test_a_dependent_released_by_two_completions_is_taken_by_the_last(pool):
    a = JobSpec(t.step, _now(), ("a",))
    b = JobSpec(t.step, _now(), ("b",))
    join = JobSpec(t.step, _now(), ("join",), depends_on=[a, b])
    ids = await Scheduler(pool).schedule_bulk([a, b, join])
    assert (await _complete(pool, ids[0], _room()))[1] == []
    assert (await _status(pool, ids[2]))["status"] == "waiting"
    handed = (await _complete(pool, ids[1], _room()))[1]
    assert [r["job_id"] for r in handed] == [ids[2]]


async def test_a_chain_continues_on_the_worker_its_dependency_completed_on(pool, make_scheduler):
    scheduler = await make_scheduler()
    specs = chain(*(JobSpec(t.step, _now(), (f"s{i}",)) for i in range(6)))
    ids = await scheduler.schedule_bulk(specs)

    async def done() -> bool:
        return await pool.fetchval(
            "SELECT count(*) = 6 FROM scheduled_jobs WHERE status = 'completed'"
            " AND job_id = ANY($1::text[])",
            ids,
        )

    await wait_until(done, timeout=15, message="the chain completed")
    rows = {
        r["job_id"]: r
        for r in await pool.fetch(
            "SELECT job_id, worker_id, attempts, started_at, finished_at FROM scheduled_jobs"
            " WHERE job_id = ANY($1::text[])",
            ids,
        )
    }
    for before, after in itertools.pairwise(ids):
        assert rows[after]["started_at"] == rows[before]["finished_at"], "taken over"
        assert rows[after]["worker_id"] == scheduler.worker_id == rows[before]["worker_id"]
        assert rows[after]["attempts"] == 1
    runs = await pool.fetch("SELECT name, started_at, ended_at FROM dep_runs ORDER BY run_id")
    assert [r["name"] for r in runs] == [f"s{i}" for i in range(6)]
    for before, after in itertools.pairwise(runs):
        assert before["ended_at"] <= after["started_at"]


async def test_a_dependent_taken_over_without_the_worker_knowing_is_handed_back(
    pool, make_scheduler
):
    """The answer of a completion that took a dependent over was lost: the row
    is running for a worker that does not own it. Its heartbeat gives it back
    and it runs."""
    scheduler = await make_scheduler()
    first = JobSpec(t.step, datetime.now(UTC) + timedelta(hours=1), ("first",))
    then = JobSpec(t.step, _now(), ("then",), depends_on=[first])
    first_id, then_id = await Scheduler(pool).schedule_bulk([first, then])
    done = await _running(pool, first_id, scheduler.worker_id)
    written, handed = await scheduler.store.complete_handing(scheduler.worker_id, [done], _room())
    assert written == {first_id} and [r["job_id"] for r in handed] == [then_id]

    async def ran() -> bool:
        return (await _status(pool, then_id))["status"] == "completed"

    await wait_until(ran, timeout=15, message="the orphaned dependent handed back and run")
    outcomes = await pool.fetch(
        "SELECT outcome FROM job_attempts WHERE job_id = $1 ORDER BY attempt_id", then_id
    )
    assert [r["outcome"] for r in outcomes] == ["handed_back"]


async def test_a_worker_that_stopped_claiming_takes_nothing_over(pool, make_scheduler):
    scheduler = await make_scheduler()
    hand_off = scheduler.worker.completer.hand_off
    assert hand_off is not None
    state = scheduler.worker.state
    # No await from here to the last check: the claim loop's own claims cannot
    # move the count meanwhile.
    before = state.claims_in_flight
    offered = hand_off.offer(3)
    assert offered is not None
    assert state.claims_in_flight == before + 1  # the write counts as a claim in flight
    room, claim = offered
    assert (room.most, room.tasks) == (
        3,
        scheduler.worker.batches.plain(scheduler.registry.names()),
    )
    await hand_off.taken(claim, [])  # no rows: nothing awaited
    assert state.claims_in_flight == before
    scheduler.worker.stop_claiming()
    assert hand_off.offer(3) is None


async def test_a_busy_worker_takes_over_only_into_free_slots(pool, make_scheduler):
    """With every slot taken, a completion takes nothing over: its dependent
    is pending, for a claim in its turn."""
    scheduler = await make_scheduler(max_concurrent_jobs=2, batch_claim_limit=2)
    hand_off = scheduler.worker.completer.hand_off
    assert hand_off is not None
    offered = hand_off.offer(5)
    assert offered is not None and offered[0].most == 2  # the free slots, not 5
    await hand_off.taken(offered[1], [])
    await scheduler.schedule(t.gate, args=("one",))
    await scheduler.schedule(t.gate, args=("two",))

    async def both_running() -> bool:
        return await pool.fetchval("SELECT count(*) = 2 FROM dep_runs WHERE ended_at IS NULL")

    await wait_until(both_running, timeout=10, message="both slots taken")
    assert hand_off.offer(5) is None
    for name in ("one", "two"):
        t.gates.setdefault(name, asyncio.Event()).set()


async def test_more_urgent_due_limited_work_keeps_the_dependent_pending(pool):
    """A more urgent due job of a limited task also comes first: the take-over
    leaves the slot to a claim."""
    first, then = await _edge(pool, priority=JobPriority.NORMAL)
    await Scheduler(pool).schedule(other, priority=JobPriority.CRITICAL)
    await pool.execute(
        "INSERT INTO scheduler_limits (scope, name, max_running)"
        " VALUES ('task', 'hand_off.other', 5)"
    )
    try:
        handed = (await _complete(pool, first, _room(tasks=["dep.step", "hand_off.other"])))[1]
        assert handed == []
        assert (await _status(pool, then))["status"] == "pending"
    finally:
        await pool.execute("DELETE FROM scheduler_limits")


async def test_a_dependent_for_another_workers_queue_starts_there_without_a_poll(
    pool, make_scheduler
):
    """The completing worker does not serve the dependent's queue: the
    dependent is released pending and the worker that serves it is woken at
    once (neither polls within the test's time)."""
    no_polling = PollingConfig(idle_start_interval=30.0, max_interval=30.0)
    here = await make_scheduler(polling_config=no_polling, queues=["default"])
    there = await make_scheduler(polling_config=no_polling, queues=["reports"])
    first = JobSpec(t.step, _now(), ("first",))
    then = JobSpec(t.step, _now(), ("then",), depends_on=[first], queue="reports")
    ids = await here.schedule_bulk([first, then])
    job = await there.wait_for(ids[1], timeout=10)
    assert job.status.value == "completed"
    rows = await pool.fetch(
        "SELECT job_id, worker_id FROM scheduled_jobs WHERE job_id = ANY($1::text[])", ids
    )
    workers = {r["job_id"]: r["worker_id"] for r in rows}
    assert workers[ids[0]] == here.worker_id and workers[ids[1]] == there.worker_id
