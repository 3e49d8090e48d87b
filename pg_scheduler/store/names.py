"""Names in the database: schema checks, table qualification, NOTIFY channels, lock keys.

Every statement in this package names tables and channels bare; ``Qualifier``
rewrites them for one schema when a store is built. The channel names are
defined here, once.
"""

from __future__ import annotations

import re
import zlib

import asyncpg

JOBS_CHANNEL = "pg_scheduler_jobs"
CANCEL_CHANNEL = "pg_scheduler_cancel"
# Pause and resume: the payload is "pause NAME" or "resume NAME".
QUEUES_CHANNEL = "pg_scheduler_queues"
EVENTS_CHANNEL = "pg_scheduler_events"
DEFAULT_SCHEMA = "public"
# A channel name is an identifier (at most 63 bytes): "pg_scheduler_cancel:" + schema.
MAX_SCHEMA_BYTES = 40

Executor = asyncpg.Pool | asyncpg.Connection

# The statements below name tables and channels bare; Qualifier rewrites them
# for one schema when a store is built, so running them costs nothing extra.
TABLES = (
    "scheduled_jobs",
    "scheduler_workers",
    "periodic_jobs",
    "vacuum_stats",
    "pg_scheduler_migrations",
    "job_attempts",
    "scheduler_limits",
    "scheduler_event_flags",
    "scheduler_queues",
    "workflow_steps",
    "workflow_signals",
    "workflow_waits",
    "job_dependencies",
    "scheduler_key_starts",
    "scheduler_throttles",
    "scheduler_batches",
)
# Functions the statements call by name (migrations 0015, 0021, 0023), qualified like tables.
FUNCTIONS = (
    "pg_scheduler_children_completed",
    "pg_scheduler_completing",
    "pg_scheduler_dependencies_completed",
    "pg_scheduler_dependencies_handed",
    "pg_scheduler_dependency_ended",
)
_TABLE_RE = re.compile(r'(?<![."\w])(' + "|".join(TABLES + FUNCTIONS) + r")\b")
_CHANNEL_RE = re.compile(rf"'({JOBS_CHANNEL}|{CANCEL_CHANNEL}|{QUEUES_CHANNEL}|{EVENTS_CHANNEL})'")


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def channel_name(channel: str, schema: str) -> str:
    """The NOTIFY channel of ``schema``: public keeps the 0.2.x names."""
    return channel if schema == DEFAULT_SCHEMA else f"{channel}:{schema}"


def check_schema(schema: object) -> str:
    """A schema name usable for tables and channel names, else ValueError/TypeError."""
    if not isinstance(schema, str):
        raise TypeError(f"schema must be a str, got {type(schema).__name__}")
    if (
        not schema
        or "\x00" in schema
        or len(schema.encode("utf-8", "surrogatepass")) > MAX_SCHEMA_BYTES
    ):
        raise ValueError(
            f"schema must be 1 to {MAX_SCHEMA_BYTES} bytes without NUL, got {schema!r}"
        )
    try:
        schema.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"schema must be valid text, got {schema!r}") from None
    return schema


def lock_key_for(key: int, schema: str) -> int:
    """An advisory lock key of one schema (public keeps the 0.2.x key)."""
    if schema == DEFAULT_SCHEMA:
        return key
    salt = zlib.crc32(schema.encode("utf-8"))
    return ((key ^ (salt << 16)) + 2**63) % 2**64 - 2**63


class Qualifier:
    """Rewrites a statement for one schema: tables qualified, channels namespaced."""

    def __init__(self, schema: str = DEFAULT_SCHEMA) -> None:
        self.schema = check_schema(schema)
        self.prefix = quote_ident(schema) + "."

    def table(self, name: str) -> str:
        return self.prefix + name

    def channel(self, channel: str) -> str:
        return channel_name(channel, self.schema)

    def __call__(self, sql: str) -> str:
        sql = _TABLE_RE.sub(lambda m: self.prefix + m[1], sql)
        return _CHANNEL_RE.sub(lambda m: "'" + self.channel(m[1]).replace("'", "''") + "'", sql)
