"""SQL of the schema's own bookkeeping: the migrations table, the migration
lock, the privilege check and the catalog check that finds objects an applied
migration implies but that are gone (a table dropped by hand or by a 0.2.x
test fixture).

Used by ``migrate.py``, which decides what to apply (``CURRENT_USER`` names who
runs it). Every statement is qualified for one schema when the store is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import asyncpg

from .names import Qualifier, quote_ident

# Arbitrary, fixed: "pg_sched" as a 64-bit integer.
MIGRATION_LOCK_KEY = 0x70675F7363686564
MIGRATIONS_TABLE = "pg_scheduler_migrations"
CURRENT_USER = "SELECT current_user::text"


class SchemaObject(NamedTuple):
    """A database object a migration creates."""

    kind: str  # "relation" (table or index), "function" or "trigger"
    name: str
    table: str = ""  # the table a trigger is on

    def __str__(self) -> str:
        return f"{self.kind} {self.name}" + (f" on {self.table}" if self.table else "")


_CREATE_MIGRATIONS_TABLE = f"""
CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""
# ON CONFLICT: a re-applied migration stays recorded once, with its first date.
_RECORD = f"""
INSERT INTO {MIGRATIONS_TABLE} (version, name) VALUES ($1, $2)
ON CONFLICT (version) DO NOTHING
"""
_APPLIED = f"SELECT version FROM {MIGRATIONS_TABLE}"
# Names arrive qualified with the schema ($4): relations, functions and
# triggers' tables are looked up there.
_MISSING = """
SELECT o.kind, o.name, o.tbl
  FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS o(kind, name, tbl, n)
 WHERE NOT CASE o.kind
           WHEN 'relation' THEN to_regclass($4::text || o.name) IS NOT NULL
           WHEN 'function' THEN to_regproc($4::text || o.name) IS NOT NULL
           ELSE EXISTS (SELECT 1 FROM pg_trigger t
                         WHERE t.tgrelid = to_regclass($4::text || o.tbl) AND t.tgname = o.name)
       END
 ORDER BY o.n
"""
# The start-up check: what is recorded and what is gone, in one statement.
# Raises UndefinedTableError on a database never migrated.
_STATE = f"""
SELECT ARRAY(SELECT version FROM {MIGRATIONS_TABLE}) AS applied,
       ARRAY(SELECT m.kind || ':' || m.name || ':' || m.tbl FROM ({_MISSING}) AS m) AS missing
"""
# What creating the schema's objects takes: CREATE on the schema, or on the
# database when the schema does not exist yet. NULL when the role has it.
_MISSING_CREATE = """
SELECT CASE
    WHEN n.oid IS NULL THEN
        CASE WHEN has_database_privilege(current_database(), 'CREATE') THEN NULL
             ELSE format('CREATE on database %I', current_database()) END
    WHEN NOT has_schema_privilege(n.oid, 'CREATE') THEN format('CREATE on schema %I', $1::text)
END, current_user::text
  FROM (SELECT $1::text AS name) s
  LEFT JOIN pg_namespace n ON n.nspname = s.name
"""

# What reading the migration state takes of a role that will not migrate: USAGE
# on the schema and SELECT on the migrations table, where they exist (catalog
# reads only, so the probe itself needs neither).
_MISSING_ACCESS = f"""
SELECT CASE WHEN n.oid IS NOT NULL AND NOT has_schema_privilege(n.oid, 'USAGE')
            THEN format('USAGE on schema %I', $1::text) END,
       CASE WHEN c.oid IS NOT NULL AND NOT has_table_privilege(c.oid, 'SELECT')
            THEN format('SELECT on %I.{MIGRATIONS_TABLE}', $1::text) END,
       current_user::text
  FROM (SELECT $1::text AS name) s
  LEFT JOIN pg_namespace n ON n.nspname = s.name
  LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = '{MIGRATIONS_TABLE}'
"""


def _columns(objects: Sequence[SchemaObject]) -> tuple[list[str], list[str], list[str]]:
    return (
        [o.kind for o in objects],
        [o.name for o in objects],
        [o.table for o in objects],
    )


class SchemaStore:
    """The migration bookkeeping statements of one schema, on one connection."""

    def __init__(self, conn: asyncpg.Connection, q: Qualifier | None = None) -> None:
        self.conn = conn
        self.q = q or Qualifier()
        self._create_migrations_table = self.q(_CREATE_MIGRATIONS_TABLE)
        self._record = self.q(_RECORD)
        self._applied = self.q(_APPLIED)
        self._state = self.q(_STATE)

    async def lock(self) -> None:
        """Serialize migrators until the surrounding transaction ends (a
        transaction-level lock stays on one server connection behind pgbouncer)."""
        await self.conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)

    async def quick_state(
        self, expected: Sequence[SchemaObject]
    ) -> tuple[set[int], list[SchemaObject]] | None:
        """Applied versions and which of ``expected`` are missing, in one round trip;
        None if the migrations table does not exist (or the check could not run)."""
        if self.conn.is_in_transaction():
            # A failed statement would abort the caller's transaction.
            return None
        try:
            row = await self.conn.fetchrow(self._state, *_columns(expected), self.q.prefix)
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
            return None
        missing = [SchemaObject(*text.split(":", 2)) for text in row["missing"]]
        return set(row["applied"]), missing

    async def missing_create_privilege(self) -> tuple[str | None, str]:
        """(the privilege creating this schema's objects needs and the role lacks, or
        None; the role's name)."""
        row = await self.conn.fetchrow(_MISSING_CREATE, self.q.schema)
        return row[0], row[1]

    async def missing_access(self) -> tuple[list[str], str]:
        """(what of USAGE on the schema and SELECT on its migrations table the
        role lacks, as "PRIVILEGE on object"; the role's name)."""
        row = await self.conn.fetchrow(_MISSING_ACCESS, self.q.schema)
        return [grant for grant in (row[0], row[1]) if grant is not None], row[2]

    async def prepare(self) -> None:
        """In the migration's transaction: the schema, the search path the files'
        bare names resolve through, and the migrations table."""
        schema = quote_ident(self.q.schema)
        await self.conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        await self.conn.execute(f"SET LOCAL search_path = {schema}")
        await self.conn.execute(self._create_migrations_table)

    async def applied_versions(self) -> set[int]:
        exists = await self.conn.fetchval(
            "SELECT to_regclass($1) IS NOT NULL", self.q.table(MIGRATIONS_TABLE)
        )
        if not exists:
            return set()
        return {r["version"] for r in await self.conn.fetch(self._applied)}

    async def missing(self, expected: Sequence[SchemaObject]) -> list[SchemaObject]:
        """The objects of ``expected`` that do not exist, in the given order."""
        if not expected:
            return []
        rows = await self.conn.fetch(_MISSING, *_columns(expected), self.q.prefix)
        return [SchemaObject(r["kind"], r["name"], r["tbl"]) for r in rows]

    async def apply(self, version: int, name: str, sql: str) -> None:
        """Run one migration's SQL and record its version (inside the caller's transaction)."""
        await self.conn.execute(sql)
        await self.conn.execute(self._record, version, name)
