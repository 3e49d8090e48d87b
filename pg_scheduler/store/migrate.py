"""Applies ``pg_scheduler/store/migrations/NNNN_name.sql`` in order, exactly
once per database, and brings back what an applied migration implies when it
has gone missing. ``pg_scheduler/store/schema.sql`` shows the schema they
leave behind (regenerate it with ``python -m pg_scheduler.store.dump_schema``).

Every process that starts runs :func:`migrate`. When the schema is current,
that is one catalog query and nothing else (no lock). Otherwise everything
pending applies in one transaction under a transaction-level advisory lock, so
ten processes starting at once apply each file once, and the files' objects
land in one schema (default ``public``).

A recorded version whose objects are missing (pg-scheduler 0.2.x test
fixtures ``DROP TABLE scheduled_jobs CASCADE`` and keep the version table) is
re-applied, with every applied version after it: migrations are idempotent,
and later ones may alter what the earlier one creates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import asyncpg

from ..support.log import get_logger
from .names import DEFAULT_SCHEMA, Qualifier
from .schema import CURRENT_USER, MIGRATION_LOCK_KEY, SchemaObject, SchemaStore

log = get_logger(__name__)

__all__ = [
    "MIGRATION_LOCK_KEY",
    "Migration",
    "MigrationError",
    "current_version",
    "load_migrations",
    "migrate",
]

_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

# What a migration creates and drops, read from its SQL (comments removed), in
# statement order: table, index, function and trigger names.
_NAME = r"([\w.]+)"
_IF_NOT_EXISTS = r"(?:IF\s+NOT\s+EXISTS\s+)?"
_DDL_RE = re.compile(
    "|".join(
        (
            rf"\bCREATE\s+(?:UNLOGGED\s+)?TABLE\s+{_IF_NOT_EXISTS}{_NAME}",
            rf"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?{_IF_NOT_EXISTS}{_NAME}",
            rf"\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+{_NAME}",
            rf"\bCREATE\s+(?:OR\s+REPLACE\s+)?TRIGGER\s+{_NAME}\s.*?\bON\s+{_NAME}",
            rf"\bDROP\s+(TABLE|INDEX|FUNCTION)\s+(?:IF\s+EXISTS\s+)?{_NAME}",
            rf"\bDROP\s+TRIGGER\s+(?:IF\s+EXISTS\s+)?{_NAME}\s+ON\s+{_NAME}",
        )
    ),
    re.IGNORECASE | re.DOTALL,
)
_COMMENT_RE = re.compile(r"--[^\n]*")


class MigrationError(RuntimeError):
    """The database schema cannot be brought to the version this code needs."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    #: (object, created) in statement order: created False for a DROP.
    ddl: tuple[tuple[SchemaObject, bool], ...] = field(default=(), compare=False, repr=False)


def _ddl_of(sql: str) -> tuple[tuple[SchemaObject, bool], ...]:
    found: list[tuple[SchemaObject, bool]] = []
    for m in _DDL_RE.finditer(_COMMENT_RE.sub("", sql)):
        table, index, function, trigger, on, drop_kind, dropped, drop_trigger, drop_on = m.groups()
        if table or index:
            found.append((SchemaObject("relation", (table or index).lower()), True))
        elif function:
            found.append((SchemaObject("function", function.lower()), True))
        elif trigger:
            found.append((SchemaObject("trigger", trigger.lower(), on.lower()), True))
        elif dropped:
            kind = "function" if drop_kind.lower() == "function" else "relation"
            found.append((SchemaObject(kind, dropped.lower()), False))
        else:
            found.append((SchemaObject("trigger", drop_trigger.lower(), drop_on.lower()), False))
    return tuple(found)


def expected_objects(migrations: list[Migration]) -> dict[SchemaObject, int]:
    """Each object ``migrations`` leave behind, with the version that last created it."""
    objects: dict[SchemaObject, int] = {}
    for migration in sorted(migrations, key=lambda m: m.version):
        for obj, created in migration.ddl:
            if created:
                objects[obj] = migration.version
            else:
                objects.pop(obj, None)
    return objects


def _migrations_dir() -> Path:
    # Package data of pg_scheduler.store, in a source checkout and in a wheel alike.
    return Path(str(resources.files("pg_scheduler.store") / "migrations"))


# Parsed files by (name, mtime, size) of each: start() checks the schema every
# time, and reading and parsing the files took about 1 ms of it.
_PARSED: dict[tuple[tuple[str, int, int], ...], list[Migration]] = {}


def load_migrations() -> list[Migration]:
    """Every migration file, in version order."""
    paths = sorted(_migrations_dir().glob("*.sql"))
    key = tuple((str(p), (st := p.stat()).st_mtime_ns, st.st_size) for p in paths)
    cached = _PARSED.get(key)
    if cached is None:
        cached = _PARSED[key] = _parse_migrations(paths)
    return list(cached)


def _parse_migrations(paths: list[Path]) -> list[Migration]:
    found: list[Migration] = []
    for path in paths:
        match = _FILE_RE.match(path.name)
        if not match:
            raise MigrationError(f"migration file name {path.name!r} is not NNNN_name.sql")
        sql = path.read_text()
        found.append(Migration(int(match[1]), match[2], sql, _ddl_of(sql)))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a version: {versions}")
    return found


async def current_version(conn: asyncpg.Connection, schema: str = DEFAULT_SCHEMA) -> int:
    """The highest applied migration, 0 for a fresh database."""
    return max(await SchemaStore(conn, Qualifier(schema)).applied_versions(), default=0)


async def migrate(
    pool_or_conn: asyncpg.Pool | asyncpg.Connection, schema: str = DEFAULT_SCHEMA
) -> list[int]:
    """Bring ``schema`` up to date; returns the versions this call applied
    (re-applied ones included).

    Raises :class:`MigrationError` with a one-line reason when the role may not
    create or alter the schema's objects.
    """
    q = Qualifier(schema)
    if isinstance(pool_or_conn, asyncpg.Pool):
        async with pool_or_conn.acquire() as conn:
            return await _migrate(conn, q)
    return await _migrate(pool_or_conn, q)


async def _migrate(conn: asyncpg.Connection, q: Qualifier) -> list[int]:
    migrations = load_migrations()
    store = SchemaStore(conn, q)
    # The common case, checked without the lock: everything recorded is there
    # (a worker with least privileges gets this far and no further).
    state = await store.quick_state(list(expected_objects(migrations)))
    if state is not None:
        applied, missing = state
        if not missing and applied >= {m.version for m in migrations}:
            _check_not_newer(applied, migrations)
            return []
    try:
        lacking, role = await store.missing_create_privilege()
        if lacking is not None:
            raise MigrationError(
                f"role {role} lacks {lacking}: run pg-scheduler migrate as the schema's owner"
            )
        async with conn.transaction():
            await store.lock()
            await store.prepare()
            done = await _migrate_locked(store, migrations)
    except asyncpg.InsufficientPrivilegeError as exc:
        user = await conn.fetchval(CURRENT_USER)
        reason = str(exc).splitlines()[0]
        raise MigrationError(
            f"role {user} cannot migrate schema {q.schema!r}: {reason}; "
            "run pg-scheduler migrate as the schema's owner"
        ) from None
    for version, name, new in done:
        if new:
            log.info("migration applied", version=version, name=name, schema=q.schema)
    return [version for version, _, _ in done]


def _check_not_newer(applied: set[int], migrations: list[Migration]) -> None:
    known = migrations[-1].version if migrations else 0
    version = max(applied, default=0)
    if version > known:
        raise MigrationError(
            f"database schema is at version {version}, newer than this pg_scheduler "
            f"knows ({known}); upgrade pg_scheduler. The database was not changed."
        )


async def _migrate_locked(
    store: SchemaStore, migrations: list[Migration]
) -> list[tuple[int, str, bool]]:
    """(version, name, first time) of each migration applied, in order."""
    applied = await store.applied_versions()
    _check_not_newer(applied, migrations)
    implied = expected_objects([m for m in migrations if m.version in applied])
    missing = await store.missing(list(implied))
    # From the first version with something missing on, re-apply every applied one.
    redo_from = min((implied[obj] for obj in missing), default=None)
    todo = [
        m
        for m in migrations
        # Any file not yet applied, even below the newest applied one: areas
        # reserve numbers, so files can land out of order.
        if m.version not in applied or (redo_from is not None and m.version >= redo_from)
    ]
    if missing:
        log.warning(
            "schema objects missing although their migrations are recorded; re-applying",
            missing=[str(obj) for obj in missing],
            versions=[m.version for m in todo if m.version in applied],
            schema=store.q.schema,
        )
    for migration in todo:
        await store.apply(migration.version, migration.name, migration.sql)
    return [(m.version, m.name, m.version not in applied) for m in todo]
