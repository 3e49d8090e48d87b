"""The enqueue statements on a caller's synchronous (DB-API) connection: psycopg 3
or psycopg2, inside the caller's own transaction (the sync client's ``connection=``).

They are the statements of :mod:`~pg_scheduler.store.job_sql` (the same rows,
the same conflict handling, the same wake-up trigger, so workers hear a
NOTIFY at commit), rewritten once from asyncpg's ``$n`` placeholders to the
``%(pn)s`` style both drivers take. Each write is a savepoint inside the
caller's transaction (a transaction of its own on an autocommit connection),
so a duplicate id raises without aborting the caller's work.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from .job_sql import _EXISTING_IDS, _INSERT_FROM_ARRAYS, _INSERT_ONE, _REPLACE_SET
from .jobs import NewJob
from .names import DEFAULT_SCHEMA, Qualifier

_PLACEHOLDER = re.compile(r"\$(\d+)")
_SAVEPOINT = "pg_scheduler_enqueue"
UNIQUE_VIOLATION = "23505"


def pyformat(sql: str) -> str:
    """``$1`` -> ``%(p1)s``, with a literal ``%`` doubled (DB-API pyformat)."""
    return _PLACEHOLDER.sub(r"%(p\1)s", sql.replace("%", "%%"))


def _params(values: Sequence[Any]) -> dict[str, Any]:
    return {f"p{n}": value for n, value in enumerate(values, start=1)}


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg 3 (``sqlstate``) or psycopg2 (``pgcode``) error."""
    return getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)


class DbapiStatements:
    """The enqueue statements of one schema, for a DB-API connection."""

    def __init__(self, schema: str = DEFAULT_SCHEMA) -> None:
        q = Qualifier(schema)
        self._insert_one = pyformat(q(_INSERT_ONE))
        self._insert_arrays = pyformat(q(_INSERT_FROM_ARRAYS))
        self._ignore = " ON CONFLICT (job_id) DO NOTHING"
        self._replace = " ON CONFLICT (job_id) " + pyformat(q(_REPLACE_SET))
        self._existing_ids = pyformat(q(_EXISTING_IDS))

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

    def atomically(self, conn: Any, work: Callable[[], Any]) -> Any:
        """Run ``work`` all-or-nothing without ending the caller's transaction:
        a savepoint inside it, or BEGIN/COMMIT on an autocommit connection."""
        autocommit = bool(getattr(conn, "autocommit", False))
        begin, commit, rollback = (
            ("BEGIN", "COMMIT", "ROLLBACK")
            if autocommit
            else (
                f"SAVEPOINT {_SAVEPOINT}",
                f"RELEASE SAVEPOINT {_SAVEPOINT}",
                f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}",
            )
        )
        with conn.cursor() as cur:
            cur.execute(begin)
        try:
            result = work()
        except BaseException:
            with conn.cursor() as cur:
                cur.execute(rollback)
                if not autocommit:
                    cur.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
            raise
        with conn.cursor() as cur:
            cur.execute(commit)
        return result
