"""SyncClient(connection=...) joins the caller's transaction the way the caller's
driver and framework see it, read from the connection's transaction status
(not its ``autocommit`` flag): inside a transaction it writes a savepoint and
never commits; outside one, on an autocommit connection, it commits a
transaction of its own. Every case checks the caller's own row (in a table of
the caller's) together with the jobs: the jobs exist exactly when the row does.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pg_scheduler import JobSpec, PollingConfig, SyncClient
from tests.support.common import wait_for_status

psycopg = pytest.importorskip("psycopg")
psycopg2 = pytest.importorskip("psycopg2")

# libpq's transaction status, as both drivers report it.
IDLE = psycopg.pq.TransactionStatus.IDLE
INTRANS = psycopg.pq.TransactionStatus.INTRANS
assert (IDLE, INTRANS) == (
    psycopg2.extensions.TRANSACTION_STATUS_IDLE,
    psycopg2.extensions.TRANSACTION_STATUS_INTRANS,
)

ORDERS = "sync_client_orders"

# Runs of each key, counted by the job body itself.
runs: Counter[str] = Counter()


async def fulfil_order(key: str, line: int = 0) -> str:
    runs[key] += 1
    return key


def transaction_status(conn: Any) -> int:
    """What the driver says (SQLAlchemy's pooled proxy: of the connection inside)."""
    conn = getattr(conn, "dbapi_connection", conn)
    if isinstance(conn, psycopg.Connection):
        return conn.info.transaction_status
    return conn.get_transaction_status()


def later() -> datetime:
    return datetime.now(UTC) + timedelta(hours=1)


class Rollback(Exception):
    """Raised inside a block to roll it back, as application code does."""


@pytest.fixture
def client(dsn: str) -> Iterator[SyncClient]:
    with SyncClient(dsn) as c:
        yield c


@pytest.fixture
async def orders(pool: Any) -> Any:
    """The caller's own table."""
    await pool.execute(f"DROP TABLE IF EXISTS {ORDERS}")
    await pool.execute(f"CREATE TABLE {ORDERS} (id text PRIMARY KEY)")
    yield ORDERS
    await pool.execute(f"DROP TABLE IF EXISTS {ORDERS}")


def place_order(conn: Any, client: SyncClient, key: str, when: Callable[[], datetime] = later):
    """What a view does: its own row, then one job and a bulk of two through the
    same connection. The client leaves the transaction status as it found it."""
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {ORDERS} (id) VALUES (%s)", (key,))
    before = transaction_status(conn)
    ids = [client.schedule(fulfil_order, execution_time=when(), args=(key,), connection=conn)]
    assert transaction_status(conn) == before
    ids += client.schedule_bulk(
        [JobSpec(fulfil_order, when(), args=(key, n)) for n in (1, 2)], connection=conn
    )
    assert transaction_status(conn) == before
    assert len(ids) == 3
    return ids


async def stored(pool: Any, key: str, ids: list[str]) -> tuple[bool, int]:
    """(the caller's row exists, how many of the jobs exist), seen from elsewhere."""
    row = await pool.fetchval(f"SELECT count(*) FROM {ORDERS} WHERE id = $1", key)
    jobs = await pool.fetchval(
        "SELECT count(*) FROM scheduled_jobs WHERE job_id = ANY($1::text[])", ids
    )
    return row == 1, jobs


# -- how callers open and end transactions ------------------------------------------


def connect(driver: str, dsn: str, autocommit: bool) -> Any:
    if driver == "psycopg":
        return psycopg.connect(dsn, autocommit=autocommit)
    conn = psycopg2.connect(dsn)
    conn.autocommit = autocommit
    return conn


class Transactions:
    """Nestable transaction blocks as each kind of caller writes them:

    - ``transaction()``: psycopg 3's ``with conn.transaction():`` (savepoints when nested);
    - ``BEGIN``: an autocommit connection with an explicit BEGIN, then SAVEPOINTs;
    - ``implicit``: DB-API's default (the driver begins at the first statement,
      the caller calls commit()/rollback()), then SAVEPOINTs;
    - ``atomic``: Django's ``transaction.atomic()`` on an autocommit connection
      (autocommit switched off for the outermost block, as Django does), then
      SAVEPOINTs.

    A block commits when it ends normally and rolls back on an exception,
    which it lets through.
    """

    def __init__(self, conn: Any, style: str) -> None:
        self.conn, self.style, self.depth = conn, style, 0

    def execute(self, sql: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql)

    @contextmanager
    def block(self) -> Iterator[None]:
        if self.style == "transaction()":
            with self.conn.transaction():
                yield
            return
        self.depth += 1
        name = f"caller_{self.depth}"
        try:
            if self.depth > 1:
                self.execute(f"SAVEPOINT {name}")
            elif self.style == "BEGIN":
                self.execute("BEGIN")
            elif self.style == "atomic":
                self.conn.autocommit = False
            try:
                yield
            except BaseException:
                if self.depth > 1:
                    self.execute(f"ROLLBACK TO SAVEPOINT {name}")
                elif self.style == "BEGIN":
                    self.execute("ROLLBACK")
                else:
                    self.conn.rollback()
                raise
            if self.depth > 1:
                self.execute(f"RELEASE SAVEPOINT {name}")
            elif self.style == "BEGIN":
                self.execute("COMMIT")
            else:
                self.conn.commit()
        finally:
            if self.depth == 1 and self.style == "atomic":
                self.conn.autocommit = True
            self.depth -= 1


# (driver, style, autocommit): every way a Django/Flask/SQLAlchemy user reaches a
# transaction on a psycopg 3 or psycopg2 connection.
STYLES = [
    ("psycopg", "transaction()", True),  # psycopg 3's documented pattern
    ("psycopg", "transaction()", False),
    ("psycopg", "BEGIN", True),
    ("psycopg", "implicit", False),
    ("psycopg", "atomic", True),
    ("psycopg2", "BEGIN", True),
    ("psycopg2", "implicit", False),
    ("psycopg2", "atomic", True),
]
STYLE_IDS = [f"{d}-{s}-{'autocommit' if a else 'no_autocommit'}" for d, s, a in STYLES]


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
@pytest.mark.parametrize(("driver", "style", "autocommit"), STYLES, ids=STYLE_IDS)
async def test_jobs_exist_exactly_when_the_callers_transaction_commits(
    pool, orders, client, dsn, driver, style, autocommit, commit
):
    key = f"{driver}-{style}-{autocommit}-{commit}"

    def caller() -> list[str]:
        conn = connect(driver, dsn, autocommit)
        tx = Transactions(conn, style)
        ids: list[str] = []
        try:
            with tx.block():
                ids = place_order(conn, client, key)
                assert transaction_status(conn) == INTRANS
                if not commit:
                    raise Rollback
        except Rollback:
            pass
        finally:
            conn.close()
        return ids

    ids = await asyncio.to_thread(caller)
    assert await stored(pool, key, ids) == ((True, 3) if commit else (False, 0))


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
async def test_psycopg2_with_connection_block(pool, orders, client, dsn, commit):
    """psycopg2's ``with conn:`` commits at the end of the block, or rolls back."""
    key = f"with-conn-{commit}"

    def caller() -> list[str]:
        conn = psycopg2.connect(dsn)
        ids: list[str] = []
        try:
            with conn:
                ids = place_order(conn, client, key)
                if not commit:
                    raise Rollback
        except Rollback:
            pass
        finally:
            conn.close()
        return ids

    ids = await asyncio.to_thread(caller)
    assert await stored(pool, key, ids) == ((True, 3) if commit else (False, 0))


@pytest.mark.parametrize("outer", [True, False], ids=["outer_commit", "outer_rollback"])
@pytest.mark.parametrize("inner", [True, False], ids=["inner_release", "inner_rollback"])
@pytest.mark.parametrize(("driver", "style", "autocommit"), STYLES, ids=STYLE_IDS)
async def test_nested_savepoints(
    pool, orders, client, dsn, driver, style, autocommit, inner, outer
):
    """Jobs scheduled in a nested block exist only if that block and every block
    around it commit; the outer block's own jobs only if it commits."""
    key = f"{driver}-{style}-{autocommit}-{inner}-{outer}"

    def caller() -> tuple[list[str], list[str]]:
        conn = connect(driver, dsn, autocommit)
        tx = Transactions(conn, style)
        outer_ids: list[str] = []
        inner_ids: list[str] = []
        try:
            with tx.block():
                outer_ids = place_order(conn, client, key + "-outer")
                try:
                    with tx.block():
                        inner_ids = place_order(conn, client, key + "-inner")
                        if not inner:
                            raise Rollback
                except Rollback:
                    pass
                # The outer transaction goes on after the inner block, either way.
                outer_ids += place_order(conn, client, key + "-after")
                if not outer:
                    raise Rollback
        except Rollback:
            pass
        finally:
            conn.close()
        return outer_ids, inner_ids

    outer_ids, inner_ids = await asyncio.to_thread(caller)
    assert len(outer_ids) == 6 and len(inner_ids) == 3
    assert await stored(pool, key + "-inner", inner_ids) == (
        (True, 3) if inner and outer else (False, 0)
    )
    for part in ("-outer", "-after"):
        row, _ = await stored(pool, key + part, [])
        assert row is outer
    _, jobs = await stored(pool, key, outer_ids)
    assert jobs == (6 if outer else 0)


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
async def test_autocommit_outside_a_transaction_commits_its_own_at_once(
    pool, orders, client, dsn, driver
):
    """Outside a transaction (autocommit; Django outside ``atomic()``) the caller's
    row commits on its own, and so do the jobs, in a transaction the client
    opens and ends: the connection is idle again after each call."""
    key = f"autocommit-{driver}"

    def caller() -> list[str]:
        conn = connect(driver, dsn, True)
        try:
            ids = place_order(conn, client, key)
            assert transaction_status(conn) == IDLE
            return ids
        finally:
            conn.close()

    ids = await asyncio.to_thread(caller)
    assert await stored(pool, key, ids) == (True, 3)


# -- connections the client refuses, writing nothing ---------------------------------


@pytest.mark.parametrize(("driver", "style", "autocommit"), STYLES, ids=STYLE_IDS)
async def test_failed_caller_transaction_is_refused_and_recoverable(
    pool, orders, client, dsn, driver, style, autocommit
):
    """A statement of the caller failed: the client raises ValueError and sends
    nothing (the transaction is the caller's to roll back). Rolled back to a
    savepoint, the same transaction schedules and commits normally."""
    key = f"failed-{driver}-{style}-{autocommit}"

    def caller() -> tuple[list[str], list[str]]:
        conn = connect(driver, dsn, autocommit)
        tx = Transactions(conn, style)
        try:
            with tx.block():
                kept = place_order(conn, client, key + "-kept")
                with conn.cursor() as cur:
                    cur.execute("SAVEPOINT before_mistake")
                    with pytest.raises(Exception, match="division by zero"):
                        cur.execute("SELECT 1 / 0")
                with pytest.raises(ValueError, match="transaction has failed"):
                    client.schedule(
                        fulfil_order, execution_time=later(), args=(key,), connection=conn
                    )
                with pytest.raises(ValueError, match="transaction has failed"):
                    client.schedule_bulk(
                        [JobSpec(fulfil_order, later(), args=(key,))], connection=conn
                    )
                with conn.cursor() as cur:
                    cur.execute("ROLLBACK TO SAVEPOINT before_mistake")
                after = place_order(conn, client, key + "-after")
            return kept, after
        finally:
            conn.close()

    kept, after = await asyncio.to_thread(caller)
    assert await stored(pool, key + "-kept", kept) == (True, 3)
    assert await stored(pool, key + "-after", after) == (True, 3)
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 6


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
async def test_aborted_implicit_transaction_is_refused(pool, orders, client, dsn, driver):
    key = f"aborted-{driver}"

    def caller() -> None:
        conn = connect(driver, dsn, False)
        try:
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO {ORDERS} (id) VALUES (%s)", (key,))
                with pytest.raises(Exception, match="division by zero"):
                    cur.execute("SELECT 1 / 0")
            with pytest.raises(ValueError, match="roll it back"):
                client.schedule(fulfil_order, execution_time=later(), args=(key,), connection=conn)
            conn.rollback()
        finally:
            conn.close()

    await asyncio.to_thread(caller)
    assert await stored(pool, key, []) == (False, 0)
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


async def test_busy_pipeline_connection_is_refused(pool, orders, client, dsn):
    """psycopg 3 pipeline mode with a statement in flight: ACTIVE, refused."""

    def caller() -> None:
        conn = psycopg.connect(dsn, autocommit=True)
        try:
            with conn.transaction(), conn.pipeline():
                conn.execute(f"INSERT INTO {ORDERS} (id) VALUES (%s)", ("piped",))
                with pytest.raises(ValueError, match="busy"):
                    client.schedule(
                        fulfil_order, execution_time=later(), args=("p",), connection=conn
                    )
                raise Rollback
        except Rollback:
            pass
        finally:
            conn.close()

    await asyncio.to_thread(caller)
    assert await stored(pool, "piped", []) == (False, 0)
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
async def test_closed_connection_and_non_connections_are_refused(pool, client, dsn, driver):
    conn = connect(driver, dsn, True)
    conn.close()
    with pytest.raises(ValueError, match="closed or broken"):
        client.schedule(fulfil_order, execution_time=later(), args=("k",), connection=conn)
    with pytest.raises(ValueError, match="closed or broken"):
        client.schedule_bulk([JobSpec(fulfil_order, later(), ("k",))], connection=conn)
    with pytest.raises(TypeError, match="psycopg 3 or psycopg2 connection"):
        client.schedule(fulfil_order, execution_time=later(), args=("k",), connection=object())
    if driver == "psycopg":
        aconn = await psycopg.AsyncConnection.connect(dsn)
        try:
            with pytest.raises(TypeError, match="async connection"):
                client.schedule(fulfil_order, execution_time=later(), args=("k",), connection=aconn)
        finally:
            await aconn.close()
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


# -- workers see a committed job (NOTIFY at commit), never a rolled-back one ---------


@pytest.mark.parametrize(("driver", "style", "autocommit"), STYLES, ids=STYLE_IDS)
async def test_worker_runs_the_committed_job_and_never_the_rolled_back_one(
    pool, orders, make_scheduler, client, dsn, driver, style, autocommit
):
    # Polling once an hour: a job run within the test's minute was woken by its NOTIFY.
    hourly = PollingConfig(idle_start_interval=3600, max_interval=3600, min_interval=3600)
    scheduler = await make_scheduler(polling_config=hourly)
    scheduler.registry.register(fulfil_order)
    key = f"worker-{driver}-{style}-{autocommit}"

    def now() -> datetime:
        return datetime.now(UTC)

    def caller() -> tuple[list[str], list[str]]:
        conn = connect(driver, dsn, autocommit)
        tx = Transactions(conn, style)
        dropped: list[str] = []
        try:
            try:
                with tx.block():
                    dropped = place_order(conn, client, key + "-dropped", now)
                    raise Rollback
            except Rollback:
                pass
            with tx.block():
                kept = place_order(conn, client, key + "-kept", now)
            return dropped, kept
        finally:
            conn.close()

    dropped, kept = await asyncio.to_thread(caller)
    for job_id in kept:
        await wait_for_status(pool, job_id, "completed", timeout=60)
    assert runs[key + "-kept"] == 3
    # The rolled-back jobs never existed, so no worker can ever run them.
    assert await stored(pool, key + "-dropped", dropped) == (False, 0)
    assert runs[key + "-dropped"] == 0


# -- SQLAlchemy (Flask-SQLAlchemy and friends) ------------------------------------------


@pytest.fixture(params=["psycopg", "psycopg2"])
def engine(request: pytest.FixtureRequest, dsn: str) -> Iterator[Any]:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.pool import NullPool

    url = sqlalchemy.engine.make_url(dsn).set(drivername=f"postgresql+{request.param}")
    eng = sqlalchemy.create_engine(url, poolclass=NullPool)
    yield eng
    eng.dispose()


def _insert(session: Any, key: str) -> None:
    from sqlalchemy import text

    session.execute(text(f"INSERT INTO {ORDERS} (id) VALUES (:id)"), {"id": key})


def _schedule_through(client: SyncClient, connection: Any, key: str) -> list[str]:
    ids = [
        client.schedule(fulfil_order, execution_time=later(), args=(key,), connection=connection)
    ]
    ids += client.schedule_bulk(
        [JobSpec(fulfil_order, later(), args=(key, n)) for n in (1, 2)], connection=connection
    )
    return ids


@pytest.mark.parametrize("handle", ["dbapi_connection", "pool_proxy"])
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
async def test_sqlalchemy_session(pool, orders, client, engine, commit, handle):
    """``with Session(engine) as s, s.begin():`` (what Flask-SQLAlchemy runs), the
    job through the session's DB-API connection or SQLAlchemy's pooled proxy of it."""
    from sqlalchemy.orm import Session

    key = f"sa-{engine.driver}-{commit}-{handle}"

    def caller() -> list[str]:
        ids: list[str] = []
        try:
            with Session(engine) as session, session.begin():
                _insert(session, key)
                proxy = session.connection().connection
                conn = proxy.dbapi_connection if handle == "dbapi_connection" else proxy
                ids = _schedule_through(client, conn, key)
                if not commit:
                    raise Rollback
        except Rollback:
            pass
        return ids

    ids = await asyncio.to_thread(caller)
    assert await stored(pool, key, ids) == ((True, 3) if commit else (False, 0))


@pytest.mark.parametrize("outer", [True, False], ids=["outer_commit", "outer_rollback"])
async def test_sqlalchemy_begin_nested(pool, orders, client, engine, outer):
    from sqlalchemy.orm import Session

    key = f"sa-nested-{engine.driver}-{outer}"

    def caller() -> tuple[list[str], list[str]]:
        kept: list[str] = []
        dropped: list[str] = []
        try:
            with Session(engine) as session, session.begin():
                _insert(session, key + "-outer")
                conn = session.connection().connection.dbapi_connection
                kept = _schedule_through(client, conn, key + "-outer")
                try:
                    with session.begin_nested():
                        _insert(session, key + "-inner")
                        dropped = _schedule_through(client, conn, key + "-inner")
                        raise Rollback
                except Rollback:
                    pass
                if not outer:
                    raise Rollback
        except Rollback:
            pass
        return kept, dropped

    kept, dropped = await asyncio.to_thread(caller)
    assert await stored(pool, key + "-outer", kept) == ((True, 3) if outer else (False, 0))
    assert await stored(pool, key + "-inner", dropped) == (False, 0)


async def test_sqlalchemy_autocommit_isolation(pool, orders, client, engine):
    """``isolation_level="AUTOCOMMIT"``: the caller's statements commit one by
    one, so the jobs commit at once too, even inside SQLAlchemy's ``begin()``
    (which sends no BEGIN at this level) that then rolls back."""
    key = f"sa-autocommit-{engine.driver}"

    def caller() -> list[str]:
        ids: list[str] = []
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            try:
                with connection.begin():
                    _insert(connection, key)
                    ids = _schedule_through(client, connection.connection.dbapi_connection, key)
                    raise Rollback
            except Rollback:
                pass
        return ids

    ids = await asyncio.to_thread(caller)
    assert await stored(pool, key, ids) == (True, 3)
