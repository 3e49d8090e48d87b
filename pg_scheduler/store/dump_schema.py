"""``schema.sql``: the schema every migration leaves behind, read from the catalog.

The migrations in ``migrations/`` redefine functions, replace indexes and add
columns over time, so no single file shows what a database holds after them.
``schema.sql`` does: every table (columns with types, defaults and NOT NULL,
constraints, storage options), each table's indexes (with their predicates)
and triggers, and every function, as PostgreSQL itself prints them, in name
order so the text is stable. Regenerate it after adding a migration::

    python -m pg_scheduler.store.dump_schema             # embedded PostgreSQL
    python -m pg_scheduler.store.dump_schema --dsn URL   # a server where it may CREATE DATABASE
    python -m pg_scheduler.store.dump_schema --check     # exit 1 with a diff if stale

Either way it migrates a new, empty database, reads its catalog and drops it.
``tests/integration/test_schema_file.py`` fails when the file and the migrations disagree.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import re
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

import asyncpg

from .migrate import load_migrations, migrate
from .names import DEFAULT_SCHEMA, quote_ident

SCHEMA_FILE = Path(__file__).with_name("schema.sql")
COMMAND = "python -m pg_scheduler.store.dump_schema"

_SERVER = "SELECT current_setting('server_version_num')::int / 10000, quote_ident($1)"
_TABLES = """
SELECT c.oid, c.relname, quote_ident(c.relname) AS quoted, c.relpersistence,
       coalesce(c.reloptions, '{}') AS options
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
 ORDER BY c.relname
"""
# Relations and types this file does not render: listed so a migration that
# adds one fails loudly instead of being left out.
_UNRENDERED = """
SELECT c.relkind::text AS kind, c.relname AS name
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relkind NOT IN ('r', 'p', 'i', 'I', 't')
   AND NOT EXISTS (SELECT 1 FROM pg_depend d
                    WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                      AND d.deptype IN ('i', 'a', 'e'))
UNION ALL
SELECT 'type ' || t.typtype::text, t.typname
  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
 WHERE n.nspname = $1 AND t.typtype IN ('e', 'd', 'r', 'm')
UNION ALL
SELECT 'routine ' || p.prokind::text, p.proname
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = $1 AND p.prokind NOT IN ('f', 'p')
 ORDER BY 1, 2
"""
_COLUMNS = """
SELECT quote_ident(a.attname) AS attname, format_type(a.atttypid, a.atttypmod) AS type,
       a.attnotnull,
       a.attidentity::text AS identity, a.attgenerated::text AS generated,
       pg_get_expr(d.adbin, d.adrelid) AS default_expr
  FROM pg_attribute a
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum
"""
# NOT NULL is shown on its column (PostgreSQL 18 also lists it here as 'n').
_CONSTRAINTS = """
SELECT quote_ident(conname) AS conname, pg_get_constraintdef(oid) AS definition
  FROM pg_constraint
 WHERE conrelid = $1 AND contype <> 'n'
 ORDER BY contype <> 'p', conname
"""
# Indexes behind a primary key, unique or exclusion constraint are that constraint.
_INDEXES = """
SELECT i.relname, pg_get_indexdef(i.oid) AS definition
  FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
 WHERE x.indrelid = $1
   AND NOT EXISTS (SELECT 1 FROM pg_constraint c
                    WHERE c.conindid = x.indexrelid AND c.conrelid = x.indrelid
                      AND c.contype IN ('p', 'u', 'x'))
 ORDER BY i.relname
"""
_TRIGGERS = """
SELECT tgname, quote_ident(tgname) AS quoted, pg_get_triggerdef(oid) AS definition,
       tgenabled::text AS enabled
  FROM pg_trigger
 WHERE tgrelid = $1 AND NOT tgisinternal
 ORDER BY tgname
"""
_FUNCTIONS = """
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args,
       pg_get_functiondef(p.oid) AS definition
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = $1 AND p.prokind IN ('f', 'p')
   AND NOT EXISTS (SELECT 1 FROM pg_depend d
                    WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                      AND d.deptype = 'e')
 ORDER BY 1, 2
"""

_HEADER = """\
-- The pg_scheduler schema as its migrations leave it (migrations/, 0001 to {last:04d}),
-- in schema {schema}: tables, indexes, triggers and functions as PostgreSQL {major}
-- prints them from the catalog of a freshly migrated database.
--
-- Generated; do not edit. Change the schema with a new migration, then run
--     {command}
-- tests/integration/test_schema_file.py fails when this file and the migrations disagree.
"""
#: The line that opens each object's entry: "-- [<kind>] <name>".
OBJECT_LINE = re.compile(r"^-- \[(?:table|index|trigger|function)\] .*$", re.M)
_MAJOR_LINE = re.compile(r"as PostgreSQL (\d+)\b")


class UnrenderedObjectError(RuntimeError):
    """The schema holds an object kind ``schema.sql`` does not render yet."""


def _column(row: asyncpg.Record) -> str:
    parts = [row["attname"], row["type"]]
    if row["generated"] == "s":
        parts.append(f"GENERATED ALWAYS AS ({row['default_expr']}) STORED")
    elif row["identity"]:
        parts.append(
            "GENERATED " + ("ALWAYS" if row["identity"] == "a" else "BY DEFAULT") + " AS IDENTITY"
        )
    elif row["default_expr"] is not None:
        parts.append(f"DEFAULT {row['default_expr']}")
    if row["attnotnull"]:
        parts.append("NOT NULL")
    return " ".join(parts)


async def dump_schema(conn: asyncpg.Connection, schema: str = DEFAULT_SCHEMA) -> str:
    """The text of ``schema.sql`` for ``schema`` as it stands on ``conn``.

    Raises :class:`UnrenderedObjectError` when the schema holds views,
    standalone sequences, types or aggregates (none of the migrations make one).
    """
    unrendered = await conn.fetch(_UNRENDERED, schema)
    if unrendered:
        found = ", ".join(f"{r['kind']} {r['name']}" for r in unrendered)
        raise UnrenderedObjectError(f"schema.sql does not render these objects yet: {found}")
    major, qualified = await conn.fetchrow(_SERVER, schema)
    versions = [m.version for m in load_migrations()]
    out = [
        _HEADER.format(last=max(versions, default=0), schema=schema, major=major, command=COMMAND)
    ]
    for table in await conn.fetch(_TABLES, schema):
        oid, name = table["oid"], table["relname"]
        lines = [f"    {_column(c)}" for c in await conn.fetch(_COLUMNS, oid)]
        lines += [
            f"    CONSTRAINT {c['conname']} {c['definition']}"
            for c in await conn.fetch(_CONSTRAINTS, oid)
        ]
        unlogged = "UNLOGGED " if table["relpersistence"] == "u" else ""
        text = f"CREATE {unlogged}TABLE {qualified}.{table['quoted']} (\n"
        text += ",\n".join(lines) + "\n)"
        if table["options"]:
            text += "\nWITH (\n" + ",\n".join(f"    {o}" for o in table["options"]) + "\n)"
        out.append(f"-- [table] {name}\n{text};\n")
        for index in await conn.fetch(_INDEXES, oid):
            out.append(f"-- [index] {index['relname']} on {name}\n{index['definition']};\n")
        for trigger in await conn.fetch(_TRIGGERS, oid):
            text = f"{trigger['definition']};"
            if trigger["enabled"] == "D":
                text += f"\nALTER TABLE {qualified}.{table['quoted']} DISABLE TRIGGER"
                text += f" {trigger['quoted']};"
            out.append(f"-- [trigger] {trigger['tgname']} on {name}\n{text}\n")
    for function in await conn.fetch(_FUNCTIONS, schema):
        definition = function["definition"].rstrip("\n")
        out.append(f"-- [function] {function['proname']}({function['args']})\n{definition};\n")
    return "\n".join(out)


def object_lines(text: str) -> list[str]:
    """The "-- [<kind>] <name>" line of each object in a ``schema.sql`` text, in order."""
    return OBJECT_LINE.findall(text)


def server_major(text: str) -> int | None:
    """The PostgreSQL major version a ``schema.sql`` text was generated on."""
    match = _MAJOR_LINE.search(text)
    return int(match[1]) if match else None


async def generate(server_dsn: str, schema: str = DEFAULT_SCHEMA) -> str:
    """Create an empty database on ``server_dsn``'s server, migrate it, return
    its ``schema.sql`` text, drop it."""
    name = f"pg_scheduler_schema_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {quote_ident(name)}")
        try:
            conn = await asyncpg.connect(server_dsn, database=name)
            try:
                await migrate(conn, schema)
                return await dump_schema(conn, schema)
            finally:
                await conn.close()
        finally:
            await admin.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
    finally:
        await admin.close()


def diff(expected: str, actual: str, path: Path | str = SCHEMA_FILE) -> str:
    """A unified diff from the file's text to the regenerated one."""
    return "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=str(path),
            tofile="regenerated from the migrations",
        )
    )


def _text_from(dsn: str | None, schema: str) -> str:
    if dsn:
        return asyncio.run(generate(dsn, schema))
    from ..embedded import start

    with tempfile.TemporaryDirectory(prefix="pg-scheduler-schema-") as tmp:
        server = start(Path(tmp) / "pgdata", cleanup="delete")
        try:
            return asyncio.run(generate(server.dsn, schema))
        finally:
            server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Regenerate schema.sql from a freshly migrated database."
    )
    parser.add_argument(
        "--dsn",
        help="a server where this may create (and then drops) a database; "
        "default: a temporary embedded PostgreSQL",
    )
    parser.add_argument(
        "-o",
        "--output",
        default=str(SCHEMA_FILE),
        help="where to write the text ('-': standard output; default: %(default)s)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a diff when the output file is stale",
    )
    parser.add_argument("--schema", default=DEFAULT_SCHEMA, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    text = _text_from(args.dsn, args.schema)
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    if args.check:
        current = path.read_text() if path.is_file() else ""
        if current == text:
            print(f"{path} is up to date")
            return 0
        sys.stdout.write(diff(current, text, path))
        print(f"{path} is stale: run {COMMAND}", file=sys.stderr)
        return 1
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover - the command
    raise SystemExit(main())
