"""The producer's writer on a caller's synchronous (DB-API) connection: psycopg 3
or psycopg2 (``SyncClient(..., connection=)``).

The rows are the :class:`~pg_scheduler.enqueue.producer.Producer`'s, checked
exactly as for ``Scheduler.schedule``; the statements are those of
:class:`~pg_scheduler.store.dbapi.DbapiStatements`. A write is all or nothing
and never commits or rolls back a transaction it did not open: inside the
caller's transaction it is a savepoint (:meth:`DbapiStatements.atomically`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ..enums import ConflictResolution
from ..store.dbapi import UNIQUE_VIOLATION, DbapiStatements, dbapi_connection, sqlstate
from ..store.jobs import NewJob
from . import timed
from .conflicts import (
    check_conflict_resolution,
    check_none_existing,
    check_repeated_ids,
    duplicate_id_error,
    ids_in_order,
)
from .dependencies import DbapiGraphWriter, Graph, plan
from .fields import JobOptions
from .producer import Producer, check_bulk_call
from .timing import THROTTLE_SCOPE, Timing

_SUFFIX = {
    ConflictResolution.RAISE: "",
    ConflictResolution.IGNORE: "ignore",
    ConflictResolution.REPLACE: "replace",
}


class DbapiEnqueuer:
    """Writes a :class:`Producer`'s rows through a caller's DB-API connection."""

    def __init__(self, producer: Producer, statements: DbapiStatements) -> None:
        self.producer = producer
        self.statements = statements
        self.graph = DbapiGraphWriter(statements)

    def schedule(
        self,
        func: Callable[..., Any],
        execution_time: Any,
        args: Any,
        kwargs: Any,
        options: JobOptions,
        conflict: Any,
        connection: Any,
    ) -> str:
        """One job (``Scheduler.schedule``'s checks and row); its id."""
        check_conflict_resolution(conflict)
        fields = self.producer.call_fields(func, execution_time, args, kwargs, options)
        row = self.producer.new_row(fields)
        if fields.timing is not None:
            return self._timed(connection, row, fields.timing, func, args, kwargs)
        _refuse_keys([row])
        if options.depends_on:
            user_id = options.job_id is not None
            graph = plan(
                [row],
                [options.depends_on],
                [options.on_dependency_failure],
                [user_id],
                None,
                conflict,
            )
            self._write_graph(connection, graph, conflict, 1)
            return row.job_id
        self._write(connection, [row], conflict, 1)
        return row.job_id

    def schedule_bulk(
        self, jobs: Any, conflict: Any, batch_size: Any, connection: Any, positional: Any
    ) -> list[str] | list[str | None]:
        """Many jobs, all or nothing (``Scheduler.schedule_bulk``'s checks and rows);
        ids in input order as it returns them."""
        check_bulk_call(conflict, batch_size, positional)
        rows = self.producer.bulk_rows(jobs)
        if not rows:
            return []
        _refuse_keys(rows)
        if any(spec.depends_on for spec in jobs):
            graph = plan(
                rows,
                [spec.depends_on for spec in jobs],
                [spec.on_dependency_failure for spec in jobs],
                [spec.job_id is not None for spec in jobs],
                jobs,
                conflict,
            )
            ids = self._write_graph(connection, graph, conflict, batch_size)
            return ids if positional else [i for i in ids if i is not None]
        user_ids = [spec.job_id for spec in jobs if spec.job_id is not None]
        if user_ids:
            check_repeated_ids(user_ids, conflict)
        raise_on = user_ids if conflict is ConflictResolution.RAISE else []
        written = self._write(connection, rows, conflict, batch_size, raise_on)
        ids = ids_in_order(rows, written, conflict)
        return ids if positional else [i for i in ids if i is not None]

    def _timed(
        self,
        connection: Any,
        row: NewJob,
        timing: Timing,
        func: Callable[..., Any],
        args: Any,
        kwargs: Any,
    ) -> str:
        """A debounced or throttled job (``timed.py``, the same statements): each
        attempt all or nothing, one that wrote nothing undone (its row locks go)."""
        conn = dbapi_connection(connection)
        statements, key = self.statements, str(row.dedupe_key)

        def attempt(work: Callable[[], str | None]) -> str | None:
            def written() -> str:
                job_id = work()
                if job_id is None:
                    raise _Nothing
                return job_id

            try:
                return statements.atomically(conn, written)  # type: ignore[no-any-return]
            except _Nothing:
                return None

        if timing.kind == THROTTLE_SCOPE:
            for _ in range(timed.THROTTLE_ATTEMPTS):
                job_id = attempt(lambda: statements.throttle(conn, row, timing.seconds))
                if job_id is not None:
                    return job_id
                holder = statements.throttle_holder(conn, key)
                if holder is not None and holder[1]:
                    return holder[0]
            raise timed.throttle_race(key)

        def debounce() -> str | None:
            seconds, max_wait = timing.seconds, timing.max_wait
            if timing.merge is None:
                return statements.debounce(conn, row, seconds, max_wait)
            holder = statements.debounce_holder(conn, key)
            if holder is None:
                return statements.debounce(conn, row, seconds, max_wait, None, True)
            mine = timed.merged_row(row, holder, timing, func, args, kwargs)
            if mine is None:
                return None
            return statements.debounce(conn, mine, seconds, max_wait, holder[0], True)

        deadline = time.monotonic() + timed.CLAIMED_WAIT
        pause = 0.005
        while True:
            job_id = attempt(debounce)
            if job_id is not None:
                return job_id
            if time.monotonic() >= deadline:
                raise timed.claimed_too_long(row)
            time.sleep(pause)  # the claimed-ahead holder starts or is handed back
            pause = min(pause * 2, 0.2)

    def _write_graph(
        self, connection: Any, graph: Graph, conflict: ConflictResolution, batch_size: int
    ) -> list[str | None]:
        """A checked graph, all or nothing, as :meth:`_write` writes rows."""
        conn = dbapi_connection(connection)
        try:
            return self.statements.atomically(  # type: ignore[no-any-return]
                conn, lambda: self.graph.write(conn, graph, conflict, batch_size)
            )
        except Exception as exc:
            if sqlstate(exc) == UNIQUE_VIOLATION:
                detail = getattr(getattr(exc, "diag", None), "message_detail", None)
                raise duplicate_id_error(detail or str(exc)) from None
            raise

    def _write(
        self,
        connection: Any,
        rows: list[NewJob],
        conflict: ConflictResolution,
        batch_size: int,
        raise_on: Sequence[str] = (),
    ) -> set[str]:
        """Write ``rows`` through the caller's connection, all or nothing (see
        :meth:`DbapiStatements.atomically`); ``raise_on``: ids refused first if
        they exist already (bulk RAISE), in the same transaction."""
        conn = dbapi_connection(connection)
        statements, suffix = self.statements, _SUFFIX[conflict]

        def work() -> set[str]:
            if raise_on:
                check_none_existing(statements.existing_ids(conn, raise_on))
            written: set[str] = set()
            for start in range(0, len(rows), batch_size):
                written |= statements.insert(conn, rows[start : start + batch_size], suffix)
            return written

        try:
            return statements.atomically(conn, work)  # type: ignore[no-any-return]
        except Exception as exc:
            if sqlstate(exc) == UNIQUE_VIOLATION:
                # Both drivers carry the server's DETAIL ("Key (job_id)=(...) already exists.").
                detail = getattr(getattr(exc, "diag", None), "message_detail", None)
                raise duplicate_id_error(detail or str(exc)) from None
            raise


class _Nothing(Exception):
    """An attempt wrote nothing: its savepoint (or transaction) is undone."""


def _refuse_keys(rows: list[NewJob]) -> None:
    """Dedupe keys need the async path's conflict handling (not written on a
    caller's DB-API connection yet; debounce and throttle are): refuse before
    anything is written."""
    if any(row.dedupe_key is not None for row in rows):
        raise ValueError(
            "SyncClient(connection=...) does not write jobs with a dedupe key "
            "(only debounced and throttled ones); "
            "schedule them without connection= (the client's own connection)"
        )
