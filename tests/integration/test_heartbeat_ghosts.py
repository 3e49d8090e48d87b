"""The heartbeat's ghost release against the claim loop, on real PostgreSQL.

The heartbeat judges "ghosts" (rows running here that no task here owns) from
rows its statement returned, a moment in the past. A claimed-ahead row handed
back in that moment and claimed again by the same worker before the ghost
release runs must not be released: its new claim is owned and will start here,
and a release would let another worker run it too.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from pg_scheduler import JobSpec, task
from tests.support.common import wait_until

gate = asyncio.Event()
runs: list[str] = []


@task(name="ghosts.blocked")
async def blocked(key: str) -> str:
    runs.append(key)
    await gate.wait()
    return key


def _past() -> datetime:
    return datetime.now(UTC) - timedelta(seconds=5)


async def test_row_handed_back_and_claimed_again_is_not_released_as_a_ghost(
    pool, make_scheduler, monkeypatch
):
    runs.clear()
    gate.clear()
    # Not started: the test is the claim loop, and calls the heartbeat itself.
    scheduler = await make_scheduler(start=False, max_concurrent_jobs=1, batch_claim_limit=2)
    worker, store = scheduler.worker, scheduler.store
    worker.handback.max_buffer_wait = 3600.0
    first, ahead = await scheduler.schedule_bulk(
        [
            JobSpec(blocked, _past() - timedelta(seconds=1), kwargs={"key": "first"}),
            JobSpec(blocked, _past(), kwargs={"key": "ahead"}),
        ]
    )
    names = scheduler.registry.names()

    async def claim() -> None:
        worker.state.claims_sent += 1
        rows = await store.claim(
            worker.worker_id, names, 2, 60.0, start_now=worker.slots.start_now()
        )
        worker.dispatch(rows)

    try:
        await claim()
        await wait_until(lambda: runs == ["first"], message="the first job running")
        assert [row["job_id"] for _, row in worker.slots.buffer] == [ahead]

        real_heartbeat = store.heartbeat
        real_reconcile = worker.heartbeat_view.reconcile

        async def heartbeat(*args, **kwargs):
            rows = await real_heartbeat(*args, **kwargs)
            assert ahead in {r["job_id"] for r in rows}
            # While the answer is on its way, the claim loop hands the buffered
            # row back (it waited too long for a slot).
            await worker.handback.hand_back_buffer()
            return rows

        def reconcile(*args, **kwargs):
            ghosts = real_reconcile(*args, **kwargs)
            # ... and claims it again before the ghost release runs.
            claimed.append(asyncio.get_running_loop().create_task(claim()))
            return ghosts

        claimed: list[asyncio.Task[None]] = []
        monkeypatch.setattr(store, "heartbeat", heartbeat)
        monkeypatch.setattr(worker.heartbeat_view, "reconcile", reconcile)
        # The re-claim commits before the release is sent: the release is the
        # heartbeat's next statement, the claim a task scheduled before it.
        real_release = store.release

        async def release_after_claim(*args, **kwargs):
            await asyncio.gather(*claimed)
            return await real_release(*args, **kwargs)

        monkeypatch.setattr(store, "release", release_after_claim)
        monkeypatch.setattr(store, "release_ghosts", _after(claimed, store), raising=False)

        await scheduler.heartbeat.run_once()
        await asyncio.gather(*claimed)

        assert ahead in worker.state.owned
        row = await pool.fetchrow(
            "SELECT status, worker_id FROM scheduled_jobs WHERE job_id = $1", ahead
        )
        # The worker holds this claim and will start it: the database must agree.
        assert (row["status"], row["worker_id"]) == ("running", worker.worker_id)
    finally:
        gate.set()
    await wait_until(lambda: sorted(runs) == ["ahead", "first"], message="both jobs ran")
    await wait_until(
        lambda: pool.fetchval(
            "SELECT count(*) = 2 FROM scheduled_jobs WHERE status = 'completed'"
            " AND job_id = ANY($1::text[])",
            [first, ahead],
        ),
        message="both completed",
    )
    assert sorted(runs) == ["ahead", "first"]
    # Never started, so shutdown leaves the completer's held connection: give it back.
    await worker.completer.connection.release()


def _after(claimed: list[asyncio.Task[None]], store):
    """Wrap ``store.release_ghosts`` (if any) to run after the re-claim committed."""
    real = getattr(store, "release_ghosts", None)

    async def wrapped(*args, **kwargs):
        await asyncio.gather(*claimed)
        assert real is not None
        return await real(*args, **kwargs)

    return wrapped
