"""Applies ``migrations/NNNN_name.sql`` in order, exactly once per database.

Every process that starts runs :func:`migrate`; an advisory lock serializes
them, so ten processes starting at once apply each file exactly once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg

from .log import get_logger

log = get_logger(__name__)

# Arbitrary, fixed: "pg_sched" as a 64-bit integer.
MIGRATION_LOCK_KEY = 0x70675F7363686564
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class MigrationError(RuntimeError):
    """The database schema cannot be brought to the version this code needs."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def _migrations_dir() -> Path:
    # A wheel ships them inside the package; a source checkout keeps them at the top.
    packaged = resources.files("pg_scheduler") / "migrations"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "migrations"


def load_migrations() -> list[Migration]:
    """Every migration file, in version order."""
    found: list[Migration] = []
    for path in sorted(_migrations_dir().glob("*.sql")):
        match = _FILE_RE.match(path.name)
        if not match:
            raise MigrationError(f"migration file name {path.name!r} is not NNNN_name.sql")
        found.append(Migration(int(match[1]), match[2], path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a version: {versions}")
    return found


async def current_version(conn: asyncpg.Connection) -> int:
    """The highest applied migration, 0 for a fresh database."""
    exists = await conn.fetchval("SELECT to_regclass('pg_scheduler_migrations') IS NOT NULL")
    if not exists:
        return 0
    return await conn.fetchval("SELECT COALESCE(max(version), 0) FROM pg_scheduler_migrations")


async def _applied_versions(conn: asyncpg.Connection) -> set[int]:
    exists = await conn.fetchval("SELECT to_regclass('pg_scheduler_migrations') IS NOT NULL")
    if not exists:
        return set()
    rows = await conn.fetch("SELECT version FROM pg_scheduler_migrations")
    return {r["version"] for r in rows}


async def migrate(pool_or_conn: asyncpg.Pool | asyncpg.Connection) -> list[int]:
    """Bring the schema up to date; returns the versions this call applied."""
    if isinstance(pool_or_conn, asyncpg.Pool):
        async with pool_or_conn.acquire() as conn:
            return await _migrate(conn)
    return await _migrate(pool_or_conn)


async def _migrate(conn: asyncpg.Connection) -> list[int]:
    migrations = load_migrations()
    known = migrations[-1].version if migrations else 0
    applied: list[int] = []
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        version = await current_version(conn)
        done = await _applied_versions(conn)
        if version > known:
            raise MigrationError(
                f"database schema is at version {version}, newer than this pg_scheduler "
                f"knows ({known}); upgrade pg_scheduler. The database was not changed."
            )
        for migration in migrations:
            # Any file not yet applied, even below the newest applied one: areas
            # reserve numbers, so files can land out of order.
            if migration.version in done:
                continue
            async with conn.transaction():
                await conn.execute(
                    """
                    CREATE TABLE IF NOT EXISTS pg_scheduler_migrations (
                        version    INTEGER PRIMARY KEY,
                        name       TEXT NOT NULL,
                        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
                    )
                    """
                )
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO pg_scheduler_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            applied.append(migration.version)
            log.info("migration applied", version=migration.version, name=migration.name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    return applied
