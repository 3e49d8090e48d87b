"""Signals with an idempotency key: a repeat of a key stores nothing and wakes
nothing (concurrent repeats included, and after the workflow has finished),
in one send and in a batch; a bad key writes nothing; and a send whose
answer was lost with its connection, after its commit, is sent again by the
library and lands once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from pg_scheduler import JobStatus, SyncClient, WorkflowContext, workflow
from pg_scheduler.testing import rescue_job, resume_workflow, run_until_crash, run_until_parked
from tests.integration.test_cli_ops import _keep_test_logging, cli  # noqa: F401
from tests.support.common import wait_for_status, wait_until
from tests.support.tcp_proxy import TcpProxy


@workflow(name="signal_keys.votes")
async def votes(ctx: WorkflowContext, count: int) -> list[Any]:
    """Takes ``count`` signals "vote", then a last one "done"; a stored repeat
    would be taken as one more vote."""
    seen = [await ctx.wait_for_signal("vote") for _ in range(count)]
    await ctx.wait_for_signal("done")
    return seen


async def _stored(pool: asyncpg.Pool, job_id: str) -> list[tuple[str, str, str | None]]:
    rows = await pool.fetch(
        "SELECT name, payload::text AS payload, idempotency_key FROM workflow_signals"
        " WHERE job_id = $1 ORDER BY id",
        job_id,
    )
    return [(r["name"], r["payload"], r["idempotency_key"]) for r in rows]


async def _waiting(scheduler: Any, pool: asyncpg.Pool, count: int = 1) -> str:
    job_id = await scheduler.schedule(votes, execution_time=datetime.now(UTC), args=(count,))
    await wait_for_status(pool, job_id, "waiting")
    return str(job_id)


async def test_a_repeated_key_stores_nothing_and_wakes_nothing(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await _waiting(scheduler, pool, count=2)
    assert await scheduler.signal(job_id, "vote", 1, idempotency_key="hook-1") is True
    # The repeat carries another payload: the first one stands.
    assert await scheduler.signal(job_id, "vote", 99, idempotency_key="hook-1") is False
    assert await scheduler.signal(job_id, "vote", 2, idempotency_key="hook-2") is True
    assert await scheduler.signal(job_id, "vote", 2, idempotency_key="hook-2") is False
    # Without a key, every send is stored.
    assert await scheduler.signal(job_id, "done") is True
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [1, 2]
    assert await _stored(pool, job_id) == [
        ("vote", "1", "hook-1"),
        ("vote", "2", "hook-2"),
        ("done", None, None),
    ]


async def test_a_key_is_per_job(pool, make_scheduler):
    scheduler = await make_scheduler()
    first, second = await _waiting(scheduler, pool), await _waiting(scheduler, pool)
    assert await scheduler.signal(first, "vote", "a", idempotency_key="same") is True
    assert await scheduler.signal(second, "vote", "b", idempotency_key="same") is True
    assert await _stored(pool, first) == [("vote", '"a"', "same")]
    assert await _stored(pool, second) == [("vote", '"b"', "same")]


async def test_a_repeat_after_the_workflow_finished_is_not_refused(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await _waiting(scheduler, pool)
    await scheduler.signal(job_id, "vote", 1, idempotency_key="v")
    await scheduler.signal(job_id, "done", idempotency_key="d")
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    # A retried webhook after the workflow took its signal and ended.
    assert await scheduler.signal(job_id, "done", idempotency_key="d") is False
    assert await scheduler.signal_bulk([(job_id, "vote", 1, "v"), (job_id, "done", None, "d")]) == 0
    # A new key, or none, is refused as before; nothing is written.
    with pytest.raises(ValueError, match="is completed: a finished job takes no signal"):
        await scheduler.signal(job_id, "done", idempotency_key="other")
    with pytest.raises(ValueError, match="is completed"):
        await scheduler.signal(job_id, "done")
    with pytest.raises(ValueError, match="is completed"):
        await scheduler.signal_bulk([(job_id, "vote", 1, "v"), (job_id, "vote", 2)])
    assert await _stored(pool, job_id) == [("vote", "1", "v"), ("done", None, "d")]


async def test_concurrent_repeats_store_one(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await _waiting(scheduler, pool)
    # 12 sends of one key at once, on the pool's connections.
    outcomes = await asyncio.gather(
        *(scheduler.signal(job_id, "vote", n, idempotency_key="once") for n in range(12))
    )
    assert sorted(outcomes) == [False] * 11 + [True]
    stored = await _stored(pool, job_id)
    assert len(stored) == 1 and stored[0][2] == "once"
    await scheduler.signal(job_id, "done")
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [int(stored[0][1])]


async def test_a_batch_leaves_out_repeats_of_a_key(pool, make_scheduler):
    scheduler = await make_scheduler()
    first = await _waiting(scheduler, pool, count=2)
    second = await _waiting(scheduler, pool)
    woken = await scheduler.signal_bulk(
        [
            (first, "vote", 1, "a"),
            (first, "vote", 2, "a"),  # the batch's own repeat: left out
            (second, "vote", 3, "a"),  # another job: its own key space
            (first, "vote", 4),  # no key: stored
        ]
    )
    assert woken == 2
    assert await scheduler.signal_bulk([(first, "vote", 5, "a"), (second, "vote", 6, "a")]) == 0
    assert await scheduler.signal(first, "vote", 7, idempotency_key="a") is False
    assert await _stored(pool, first) == [("vote", "1", "a"), ("vote", "4", None)]
    assert await _stored(pool, second) == [("vote", "3", "a")]
    await scheduler.signal_bulk([(first, "done", None, "end"), (second, "done", None, "end")])
    assert (await scheduler.result(first, timeout=10)) == [1, 4]
    assert (await scheduler.result(second, timeout=10)) == [3]


@pytest.mark.parametrize(
    ("key", "error"),
    [
        (7, TypeError),
        ("", TypeError),
        (b"k", TypeError),
        ("nul \x00", ValueError),
        ("x" * 1025, ValueError),
    ],
)
async def test_a_bad_key_is_refused_and_writes_nothing(pool, make_scheduler, key, error):
    scheduler = await make_scheduler()
    job_id = await _waiting(scheduler, pool)
    with pytest.raises(error, match="idempotency_key"):
        await scheduler.signal(job_id, "vote", 1, idempotency_key=key)
    with pytest.raises(error, match="idempotency_key"):
        await scheduler.signal_bulk([(job_id, "vote", 1, "fine"), (job_id, "vote", 2, key)])
    with pytest.raises(TypeError, match=r"signals\[0\] must be"):
        await scheduler.signal_bulk([(job_id, "vote", 1, "k", "extra")])
    assert await _stored(pool, job_id) == []


async def test_the_sync_client_sends_a_key_once(pool, dsn, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await _waiting(scheduler, pool)
    client = SyncClient(dsn)
    try:
        sent = await asyncio.to_thread(client.signal, job_id, "vote", 1, idempotency_key="s")
        again = await asyncio.to_thread(client.signal, job_id, "vote", 2, idempotency_key="s")
        bulk = await asyncio.to_thread(client.signal_bulk, [(job_id, "vote", 3, "s")])
    finally:
        await asyncio.to_thread(client.close)
    assert (sent, again, bulk) == (True, False, 0)
    assert await _stored(pool, job_id) == [("vote", "1", "s")]


async def test_the_command_line_sends_a_signal_once_by_its_key(pool, dsn, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await _waiting(scheduler, pool)
    args = ("workflows", "signal", job_id, "vote", "--payload", '{"by": "ann"}', "--key", "t1")
    sent = await cli(dsn, *args, "--json")
    assert sent.code == 0, sent.err
    assert sent.json() == {"job_id": job_id, "signal": "vote", "stored": True}
    again = await cli(dsn, *args)
    assert again.code == 0 and "not sent" in again.out, again.err
    done = await cli(dsn, "workflows", "signal", job_id, "done")
    assert done.code == 0 and f"sent 'done' to {job_id}" in done.out, done.err
    assert (await scheduler.result(job_id, timeout=10)) == [{"by": "ann"}]
    refused = await cli(dsn, "workflows", "signal", job_id, "done")
    assert refused.code == 1 and "a finished job takes no signal" in refused.err
    unknown = await cli(dsn, "workflows", "signal", "no-such-job", "done")
    assert unknown.code == 1 and "no job with id" in unknown.err
    for bad in (("--payload", "{not json"), ("--key", ""), ("--key", "nul \x00")):
        wrong = await cli(dsn, "workflows", "signal", job_id, "vote", *bad)
        assert wrong.code == 2, (bad, wrong.out, wrong.err)
    wrong = await cli(dsn, "workflows", "signal", job_id, "nul \x00 name")
    assert wrong.code == 2 and "signal name" in wrong.err, (wrong.out, wrong.err)
    assert len(await _stored(pool, job_id)) == 2


# -- from a workflow: ctx.signal ------------------------------------------------------


@workflow(name="signal_keys.teller")
async def teller(ctx: WorkflowContext, target: str, times: int) -> str:
    for n in range(times):
        await ctx.signal(target, "vote", n, key=n)
    await ctx.signal(target, "done")
    return "told"


async def test_a_workflow_signals_another_once_per_step(pool, make_scheduler):
    scheduler = await make_scheduler()
    listener = await _waiting(scheduler, pool, count=2)
    told = await scheduler.schedule(teller, args=(listener, 2))
    assert await scheduler.result(told, timeout=10) == "told"
    assert await scheduler.result(listener, timeout=10) == [0, 1]
    assert [(name, key) for name, _, key in await _stored(pool, listener)] == [
        ("vote", f"workflow:{told}:1"),
        ("vote", f"workflow:{told}:2"),
        ("done", f"workflow:{told}:3"),
    ]
    # A refused signal fails its step, and the workflow with it.
    late = await scheduler.schedule(teller, args=(listener, 1))
    job = await scheduler.wait_for(late, timeout=10)
    assert job.status is JobStatus.FAILED
    assert "signal vote to" in (job.error or "") and "finished job" in (job.error or "")


async def test_a_workflow_with_the_longest_id_signals_too(pool, make_scheduler):
    scheduler = await make_scheduler()
    listener = await _waiting(scheduler, pool)
    long_id = "t" * 1020  # the key would pass 1,024 bytes: the id's digest stands in
    await scheduler.schedule(teller, args=(listener, 1), job_id=long_id)
    assert await scheduler.result(long_id, timeout=10) == "told"
    keys = [key for _, _, key in await _stored(pool, listener)]
    assert [k.rsplit(":", 1)[1] for k in keys] == ["1", "2"]
    assert all(k.startswith("workflow-sha256:") for k in keys), keys


async def test_a_signal_sent_again_by_a_replay_lands_once(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    listener = await scheduler.schedule(votes, execution_time=datetime.now(UTC), args=(2,))
    assert (await run_until_parked(scheduler, listener)).status is JobStatus.WAITING
    told = await scheduler.schedule(teller, execution_time=datetime.now(UTC), args=(listener, 2))
    # The worker dies right after the first signal's step...
    job = await run_until_crash(scheduler, told, 1)
    assert job.status is JobStatus.RUNNING
    # ... before its record was written: the next run sends the signal again.
    await pool.execute("DELETE FROM workflow_steps WHERE job_id = $1 AND seq = 1", told)
    await rescue_job(scheduler, told)
    job = await resume_workflow(scheduler, told)
    assert job.status is JobStatus.COMPLETED, job.error
    assert [(name, payload) for name, payload, _ in await _stored(pool, listener)] == [
        ("vote", "0"),
        ("vote", "1"),
        ("done", None),
    ]
    job = await resume_workflow(scheduler, listener)
    assert job.result == [0, 1]


# -- a lost answer ---------------------------------------------------------------

# The first insert of a signal sleeps at its commit (a deferred trigger), so
# the test can cut the connection while the commit is certain to land and
# its answer certain to be lost.
_SLOW_COMMIT = """
CREATE TABLE IF NOT EXISTS signal_keys_slowed (done boolean);
CREATE OR REPLACE FUNCTION signal_keys_slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM signal_keys_slowed) THEN
        INSERT INTO signal_keys_slowed VALUES (true);
        PERFORM pg_sleep(1.0);
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS signal_keys_slow ON workflow_signals;
CREATE CONSTRAINT TRIGGER signal_keys_slow AFTER INSERT ON workflow_signals
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION signal_keys_slow();
"""


@pytest.fixture
async def slow_commit(pool: asyncpg.Pool) -> AsyncIterator[None]:
    await pool.execute(_SLOW_COMMIT)
    yield
    await pool.execute(
        "DROP TRIGGER IF EXISTS signal_keys_slow ON workflow_signals;"
        " DROP TABLE IF EXISTS signal_keys_slowed"
    )


async def _cut_at_the_commit(
    pool: asyncpg.Pool, dsn: str, proxy: TcpProxy, make_scheduler: Any, key: str | None
) -> tuple[str, Any]:
    """Send "vote" to a parked workflow through ``proxy``; cut the path while
    its commit sleeps. The job id and what the send returned or raised."""
    scheduler = await make_scheduler()
    job_id = await _waiting(scheduler, pool)
    through = await asyncpg.create_pool(proxy.dsn_for(dsn), min_size=1, max_size=2)
    try:
        sender = await make_scheduler(start=False, db_pool=through)
        send = asyncio.create_task(sender.signal(job_id, "vote", 1, idempotency_key=key))

        async def committing() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
                    " AND query LIKE '%workflow_signals%'"
                )
            )

        await wait_until(committing, message="the send's commit under way")
        proxy.cut()
        try:
            outcome: Any = await asyncio.wait_for(send, 20)
        except Exception as exc:
            outcome = exc
        return job_id, outcome
    finally:
        await through.close()


async def test_a_keyed_send_whose_answer_was_lost_is_sent_again_and_lands_once(
    pool, dsn, proxy, slow_commit, make_scheduler
):
    job_id, outcome = await _cut_at_the_commit(pool, dsn, proxy, make_scheduler, "lost-answer")
    assert outcome is False  # sent again: found stored
    assert proxy.accepted >= 2  # the second send came on a new connection
    assert await _stored(pool, job_id) == [("vote", "1", "lost-answer")]
    scheduler = await make_scheduler()
    await scheduler.signal(job_id, "done")
    assert (await scheduler.result(job_id, timeout=10)) == [1]


async def test_an_unkeyed_send_whose_answer_was_lost_reaches_the_caller(
    pool, dsn, proxy, slow_commit, make_scheduler
):
    job_id, outcome = await _cut_at_the_commit(pool, dsn, proxy, make_scheduler, None)
    assert isinstance(outcome, (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError))
    # It landed: not sending it again was right.
    await wait_until(lambda: _stored(pool, job_id), message="the lost send's commit")
    assert await _stored(pool, job_id) == [("vote", "1", None)]


async def test_a_repeat_in_a_repeatable_read_transaction_is_a_serialization_failure(
    pool, make_scheduler
):
    """In the caller's REPEATABLE READ transaction, a first send of the key
    committed after the transaction's snapshot cannot be seen: PostgreSQL
    refuses the repeat with a serialization failure (the caller retries its
    transaction, as for any), and the retried transaction gets False."""
    scheduler = await make_scheduler()
    job_id = await _waiting(scheduler, pool, count=2)
    # A signal it does not wait for: nothing wakes it, so its row stays as it
    # is while the transactions run (a change to it would refuse them too).
    async with pool.acquire() as conn:
        tx = conn.transaction(isolation="repeatable_read")
        await tx.start()
        await conn.fetchval("SELECT 1")  # the snapshot is taken
        assert await scheduler.signal(job_id, "note", 1, idempotency_key="rr") is True
        with pytest.raises(asyncpg.SerializationError):
            await scheduler.signal(job_id, "note", 2, idempotency_key="rr", connection=conn)
        await tx.rollback()
        async with conn.transaction(isolation="repeatable_read"):
            assert (
                await scheduler.signal(job_id, "note", 2, idempotency_key="rr", connection=conn)
                is False
            )
    assert await _stored(pool, job_id) == [("note", "1", "rr")]
