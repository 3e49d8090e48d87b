"""The enqueue and signal statements on a caller's synchronous (DB-API)
connection: psycopg 3 or psycopg2 (the sync client's ``connection=``).

They are the statements of :mod:`~pg_scheduler.store.job_sql` (the same rows,
the same conflict handling, the same wake-up trigger, so workers hear a
NOTIFY at commit) and :mod:`~pg_scheduler.store.signal_sql`, rewritten once
from asyncpg's ``$n`` placeholders to the ``%(pn)s`` style both drivers take.

Whose transaction a write joins is read from the connection's transaction
status, never from its ``autocommit`` flag alone (:meth:`DbapiStatements.atomically`):
inside the caller's transaction a write is a savepoint and nothing here
commits; outside one, on an autocommit connection, it is a transaction of its
own, committed here.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

from .dependencies import _APPLY_ENDED, _INSERT_DEPENDENTS, _INSERT_EDGES, _LOCK_DEPENDENCIES
from .job_sql import _EXISTING_IDS, _INSERT_FROM_ARRAYS, _INSERT_ONE, _REPLACE_SET
from .jobs import NewJob
from .names import DEFAULT_SCHEMA, Qualifier
from .signal_sql import _SIGNAL, _SIGNAL_CHECK, _SIGNAL_KEPT, _SIGNAL_MANY
from .timing import (
    _DEBOUNCE,
    _DEBOUNCE_HOLDER,
    _THROTTLE,
    _THROTTLE_HOLDER,
    debounce_params,
    throttle_params,
)

_PLACEHOLDER = re.compile(r"\$(\d+)")
_SAVEPOINT = "pg_scheduler_enqueue"
UNIQUE_VIOLATION = "23505"

# libpq's PGTransactionStatusType, which psycopg 3 (``conn.info.transaction_status``)
# and psycopg2 (``conn.get_transaction_status()``) both report as these numbers.
IDLE, ACTIVE, INTRANS, INERROR, UNKNOWN = range(5)

_REFUSED = {
    INERROR: (
        "the connection's transaction has failed (a statement in it raised): roll it back, "
        "or back to a savepoint, before scheduling through it; nothing was written"
    ),
    ACTIVE: (
        "the connection is busy (a statement is in progress on it, e.g. in pipeline mode): "
        "schedule through it when its statements have finished; nothing was written"
    ),
    UNKNOWN: (
        "the connection is closed or broken (its transaction status is unknown); "
        "nothing was written"
    ),
}


def pyformat(sql: str) -> str:
    """``$1`` -> ``%(p1)s``, with a literal ``%`` doubled (DB-API pyformat)."""
    return _PLACEHOLDER.sub(r"%(p\1)s", sql.replace("%", "%%"))


def _params(values: Sequence[Any]) -> dict[str, Any]:
    return {f"p{n}": value for n, value in enumerate(values, start=1)}


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg 3 (``sqlstate``) or psycopg2 (``pgcode``) error."""
    return getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)


def dbapi_connection(connection: Any) -> Any:
    """The driver's connection: SQLAlchemy's pooled proxy
    (``session.connection().connection``) gives its ``dbapi_connection``."""
    inner = getattr(connection, "dbapi_connection", None)
    return connection if inner is None else inner


def transaction_status(conn: Any) -> int:
    """The connection's libpq transaction status (IDLE, ACTIVE, INTRANS, INERROR,
    UNKNOWN): psycopg2's ``get_transaction_status()``, psycopg 3's
    ``info.transaction_status``. TypeError for anything else."""
    if inspect.iscoroutinefunction(getattr(conn, "commit", None)):
        raise TypeError(
            f"connection is an async connection ({type(conn).__name__}): in async code "
            "use Scheduler.schedule(connection=...); SyncClient takes a synchronous one"
        )
    get = getattr(conn, "get_transaction_status", None)  # psycopg2
    if callable(get):
        return int(get())
    status = getattr(getattr(conn, "info", None), "transaction_status", None)  # psycopg 3
    if status is None or not callable(getattr(conn, "cursor", None)):
        raise TypeError(
            "connection must be a psycopg 3 or psycopg2 connection (with SQLAlchemy: "
            f"session.connection().connection.dbapi_connection), got {type(conn).__name__}"
        )
    return int(status)


def in_callers_transaction(conn: Any) -> bool:
    """Whether a write through ``conn`` joins the caller's transaction (True) or
    needs one of its own (False: an autocommit connection outside a transaction).

    INTRANS: the caller's transaction (an explicit BEGIN, psycopg 3's
    ``conn.transaction()``, a savepoint), whatever ``autocommit`` says. IDLE
    without autocommit: the driver opens the caller's transaction at the next
    statement (DB-API), and the caller ends it. A failed, busy or closed
    connection raises ValueError before anything is sent."""
    status = transaction_status(conn)
    if status == INTRANS:
        return True
    if status == IDLE:
        return not getattr(conn, "autocommit", False)
    raise ValueError(_REFUSED.get(status, _REFUSED[UNKNOWN]))


class DbapiStatements:
    """The enqueue and signal statements of one schema, for a DB-API connection."""

    def __init__(self, schema: str = DEFAULT_SCHEMA) -> None:
        q = Qualifier(schema)
        self._insert_one = pyformat(q(_INSERT_ONE))
        self._insert_arrays = pyformat(q(_INSERT_FROM_ARRAYS))
        self._ignore = " ON CONFLICT (job_id) DO NOTHING"
        self._replace = " ON CONFLICT (job_id) " + pyformat(q(_REPLACE_SET))
        self._existing_ids = pyformat(q(_EXISTING_IDS))
        self._lock_dependencies = pyformat(q(_LOCK_DEPENDENCIES))
        self._insert_dependents = pyformat(q(_INSERT_DEPENDENTS))
        self._insert_edges = pyformat(q(_INSERT_EDGES))
        self._apply_ended = pyformat(q(_APPLY_ENDED))
        self._debounce = pyformat(q(_DEBOUNCE))
        self._debounce_holder = pyformat(q(_DEBOUNCE_HOLDER))
        self._throttle = pyformat(q(_THROTTLE))
        self._throttle_holder = pyformat(q(_THROTTLE_HOLDER))
        self._signal = pyformat(q(_SIGNAL))
        self._signal_check = pyformat(q(_SIGNAL_CHECK))
        self._signal_many = pyformat(q(_SIGNAL_MANY))
        self._signal_kept = pyformat(q(_SIGNAL_KEPT))

    def insert(self, conn: Any, rows: Sequence[NewJob], suffix: str) -> set[str]:
        """INSERT ``rows`` then ``suffix`` ("", "ignore" or "replace"); the ids written."""
        tail = {"": "", "ignore": self._ignore, "replace": self._replace}[suffix]
        values: list[Any]
        if len(rows) == 1:
            sql, values = self._insert_one, list(rows[0])
        else:
            sql, values = self._insert_arrays, [list(c) for c in zip(*rows, strict=True)]
        with conn.cursor() as cur:
            cur.execute(sql + tail + " RETURNING job_id", _params(values))
            return {r[0] for r in cur.fetchall()}

    def existing_ids(self, conn: Any, job_ids: Sequence[str]) -> list[str]:
        with conn.cursor() as cur:
            cur.execute(self._existing_ids, _params([list(job_ids)]))
            return [r[0] for r in cur.fetchall()]

    # -- declared dependencies (store/dependencies.py: the same statements) -------

    def lock_dependencies(self, conn: Any, job_ids: Sequence[str]) -> dict[str, str]:
        with conn.cursor() as cur:
            cur.execute(self._lock_dependencies, _params([list(job_ids)]))
            return {r[0]: r[1] for r in cur.fetchall()}

    def insert_dependents(
        self,
        conn: Any,
        rows: Sequence[NewJob],
        unmet: Sequence[int | None],
        depended: Sequence[bool],
    ) -> None:
        values: list[Any] = [list(c) for c in zip(*rows, strict=True)]
        values += [list(unmet), list(depended)]
        with conn.cursor() as cur:
            cur.execute(self._insert_dependents, _params(values))

    def insert_edges(self, conn: Any, edges: Sequence[tuple[Any, ...]]) -> None:
        with conn.cursor() as cur:
            cur.execute(self._insert_edges, _params([list(c) for c in zip(*edges, strict=True)]))

    def apply_ended(self, conn: Any, ended: dict[str, str]) -> None:
        with conn.cursor() as cur:
            cur.execute(self._apply_ended, _params([list(ended), list(ended.values())]))

    # -- debounce and throttle (store/timing.py: the same statements) -------------

    def _one(self, conn: Any, sql: str, values: Sequence[Any]) -> Any:
        with conn.cursor() as cur:
            cur.execute(sql, _params(values))
            return cur.fetchone()

    def debounce(
        self,
        conn: Any,
        row: NewJob,
        seconds: float,
        max_wait: float | None,
        only_holder: str | None = None,
        merged: bool = False,
    ) -> str | None:
        args = debounce_params(row, seconds, max_wait, merged, only_holder)
        found = self._one(conn, self._debounce, args)
        return None if found is None else found[0]

    def debounce_holder(self, conn: Any, key: str) -> tuple[Any, ...] | None:
        found = self._one(conn, self._debounce_holder, [key])
        return None if found is None else tuple(found)

    def throttle(self, conn: Any, row: NewJob, period: float) -> str | None:
        found = self._one(conn, self._throttle, throttle_params(row, period))
        return None if found is None else found[0]

    def throttle_holder(self, conn: Any, key: str) -> tuple[str, bool] | None:
        found = self._one(conn, self._throttle_holder, [key])
        return None if found is None else (found[0], found[1])

    # -- signals (store/signal_sql.py: the same statements; the answers shaped
    # as WorkflowStore's, for workflows/signals.py) --------------------------------

    def signal(
        self, conn: Any, job_id: str, name: str, payload: str | None, key: str | None
    ) -> dict[str, Any] | None:
        found = self._one(conn, self._signal, [job_id, name, payload, key])
        return (
            None
            if found is None
            else dict(zip(("status", "signal_id", "woken"), found, strict=True))
        )

    def signal_check(self, conn: Any, job_ids: Sequence[str]) -> list[dict[str, Any]]:
        with conn.cursor() as cur:
            cur.execute(self._signal_check, _params([list(job_ids)]))
            return [{"job_id": r[0], "status": r[1]} for r in cur.fetchall()]

    def signal_many(
        self,
        conn: Any,
        job_ids: Sequence[str],
        names: Sequence[str],
        payloads: Sequence[str | None],
        keys: Sequence[str | None],
    ) -> dict[str, Any]:
        values = [list(job_ids), list(names), list(payloads), list(keys)]
        found = self._one(conn, self._signal_many, values)
        return dict(zip(("sent", "woken", "notified"), found, strict=True))

    def signal_kept(
        self, conn: Any, job_ids: Sequence[str], keys: Sequence[str]
    ) -> set[tuple[str, str]]:
        with conn.cursor() as cur:
            cur.execute(self._signal_kept, _params([list(job_ids), list(keys)]))
            return {(r[0], r[1]) for r in cur.fetchall()}

    def atomically(self, conn: Any, work: Callable[[], Any]) -> Any:
        """Run ``work`` all-or-nothing, never ending a transaction this did not open.

        Inside the caller's transaction (:func:`in_callers_transaction`): a
        savepoint, released on success and rolled back to on error, so an
        error leaves the caller's transaction usable and its work intact;
        the caller commits or rolls back. On an autocommit connection outside
        a transaction: BEGIN, then COMMIT (ROLLBACK on error), back to IDLE.
        A failed, busy or closed connection: ValueError, nothing sent."""
        undo: tuple[str, ...]
        if in_callers_transaction(conn):
            begin, commit = f"SAVEPOINT {_SAVEPOINT}", f"RELEASE SAVEPOINT {_SAVEPOINT}"
            undo = (f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}", f"RELEASE SAVEPOINT {_SAVEPOINT}")
        else:
            begin, commit, undo = "BEGIN", "COMMIT", ("ROLLBACK",)
        with conn.cursor() as cur:
            cur.execute(begin)
        try:
            result = work()
        except BaseException as exc:
            try:
                with conn.cursor() as cur:
                    for statement in undo:
                        cur.execute(statement)
            except Exception as undo_error:  # a broken connection: the first error says why
                exc.add_note(f"undoing the enqueue failed too: {undo_error!r}")
            raise
        with conn.cursor() as cur:
            cur.execute(commit)
        return result
