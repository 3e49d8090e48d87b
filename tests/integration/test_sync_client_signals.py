"""SyncClient.signal / signal_bulk on the caller's psycopg 3 or psycopg2
connection: inside the caller's transaction the signal is a savepoint of it,
exists (and wakes the workflow) exactly when the caller commits, and the
client never commits or rolls back; a refused signal leaves the caller's
transaction usable with its own work intact; on an autocommit connection
outside a transaction it is committed before the call returns. Keys work as
on the client's own connection."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from pg_scheduler import JobNotFound, WorkflowContext, workflow
from tests.integration import test_sync_client_transactions as transactions
from tests.integration.test_sync_client_transactions import (
    INTRANS,
    STYLE_IDS,
    STYLES,
    Transactions,
    connect,
    transaction_status,
)
from tests.support.common import wait_for_status

ORDERS = transactions.ORDERS


@workflow(name="sync_signals.approval")
async def approval(ctx: WorkflowContext) -> Any:
    return await ctx.wait_for_signal("approved")


# The caller's connection and table, as in the transactional enqueue tests.
client = transactions.client
orders = transactions.orders


async def _waiting(scheduler: Any, pool: Any) -> str:
    job_id = await scheduler.schedule(approval, execution_time=datetime.now(UTC))
    await wait_for_status(pool, job_id, "waiting")
    return str(job_id)


async def _signals(pool: Any, job_id: str) -> list[tuple[str, str | None]]:
    rows = await pool.fetch(
        "SELECT payload::text AS payload, idempotency_key FROM workflow_signals"
        " WHERE job_id = $1 ORDER BY id",
        job_id,
    )
    return [(r["payload"], r["idempotency_key"]) for r in rows]


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
@pytest.mark.parametrize(("driver", "style", "autocommit"), STYLES, ids=STYLE_IDS)
async def test_a_signal_exists_exactly_when_the_callers_transaction_commits(
    pool, orders, client, dsn, make_scheduler, driver, style, autocommit, commit
):
    scheduler = await make_scheduler()
    one, many = await _waiting(scheduler, pool), await _waiting(scheduler, pool)
    key = f"{driver}-{style}-{autocommit}-{commit}"
    seen_inside: list[Any] = []

    def caller() -> None:
        conn = connect(driver, dsn, autocommit)
        tx = Transactions(conn, style)
        try:
            with tx.block():
                with conn.cursor() as cur:
                    cur.execute(f"INSERT INTO {ORDERS} (id) VALUES (%s)", (key,))
                sent = client.signal(one, "approved", key, connection=conn, idempotency_key="k")
                again = client.signal(one, "approved", "x", connection=conn, idempotency_key="k")
                woken = client.signal_bulk([(many, "approved", key, "k")], connection=conn)
                seen_inside.append((sent, again, woken, transaction_status(conn)))
                # Seen from another connection: nothing yet.
                with connect(driver, dsn, True) as other, other.cursor() as cur:
                    cur.execute("SELECT count(*) FROM workflow_signals")
                    seen_inside.append(cur.fetchone()[0])
                if not commit:
                    raise RuntimeError("the caller rolls back")
        except RuntimeError:
            pass
        finally:
            conn.close()

    await asyncio.to_thread(caller)
    assert seen_inside == [(True, False, 1, INTRANS), 0]
    row = await pool.fetchval(f"SELECT count(*) FROM {ORDERS} WHERE id = $1", key)
    if commit:
        assert row == 1
        assert await _signals(pool, one) == [(f'"{key}"', "k")]
        assert await scheduler.result(one, timeout=10) == key
        assert await scheduler.result(many, timeout=10) == key
    else:
        assert row == 0
        assert await _signals(pool, one) == [] and await _signals(pool, many) == []
        assert (await scheduler.get_job(one)).status == "waiting"
        assert (await scheduler.get_job(many)).status == "waiting"


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
async def test_a_refused_signal_leaves_the_callers_transaction_usable(
    pool, orders, client, dsn, make_scheduler, driver
):
    scheduler = await make_scheduler()
    job_id = await _waiting(scheduler, pool)

    def caller() -> None:
        conn = connect(driver, dsn, False)
        try:
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO {ORDERS} (id) VALUES ('kept')")
            with pytest.raises(JobNotFound):
                client.signal("no-such-job", "approved", connection=conn)
            with pytest.raises(JobNotFound):
                client.signal_bulk(
                    [(job_id, "approved", 1), ("no-such-job", "approved")], connection=conn
                )
            with pytest.raises(TypeError, match="idempotency_key"):
                client.signal(job_id, "approved", connection=conn, idempotency_key="")
            with pytest.raises(TypeError, match="psycopg"):
                client.signal(job_id, "approved", connection=object())
            assert transaction_status(conn) == INTRANS  # still the caller's, not failed
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO {ORDERS} (id) VALUES ('after')")
            conn.commit()
        finally:
            conn.close()

    await asyncio.to_thread(caller)
    assert await pool.fetchval(f"SELECT count(*) FROM {ORDERS}") == 2
    assert await _signals(pool, job_id) == []
    assert (await scheduler.get_job(job_id)).status == "waiting"


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
async def test_on_an_autocommit_connection_the_signal_is_committed_by_the_call(
    pool, client, dsn, make_scheduler, driver
):
    scheduler = await make_scheduler()
    job_id = await _waiting(scheduler, pool)

    def caller() -> bool:
        conn = connect(driver, dsn, True)
        try:
            sent = client.signal(job_id, "approved", {"by": "ann"}, connection=conn)
            assert transaction_status(conn) != INTRANS  # committed, back to idle
            return sent
        finally:
            conn.close()

    assert await asyncio.to_thread(caller) is True
    assert await scheduler.result(job_id, timeout=10) == {"by": "ann"}


async def test_a_sqlalchemy_session_signals_in_its_transaction(pool, client, dsn, make_scheduler):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    scheduler = await make_scheduler()
    sent, rolled_back = await _waiting(scheduler, pool), await _waiting(scheduler, pool)
    engine = sqlalchemy.create_engine(dsn.replace("postgresql://", "postgresql+psycopg://", 1))

    def caller() -> None:
        with Session(engine) as session, session.begin():
            # The pooled proxy, as session.connection().connection gives it.
            client.signal(sent, "approved", "yes", connection=session.connection().connection)
        with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
            proxy = session.connection().connection
            client.signal_bulk([(rolled_back, "approved", "no")], connection=proxy)
            raise RuntimeError("the caller rolls back")
        engine.dispose()

    await asyncio.to_thread(caller)
    assert await scheduler.result(sent, timeout=10) == "yes"
    assert await _signals(pool, rolled_back) == []
    assert (await scheduler.get_job(rolled_back)).status == "waiting"
