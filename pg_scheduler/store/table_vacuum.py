"""The library's own VACUUM of ``scheduled_jobs``: whether it may run one, how
many dead rows the table holds, and the VACUUM itself (services/table_vacuum.py
says when)."""

from __future__ import annotations

import asyncpg

from .names import DEFAULT_SCHEMA, Qualifier

# VACUUM needs the table's owner (or, from PostgreSQL 17, MAINTAIN on it).
_MAY_VACUUM = """
SELECT pg_has_role(c.relowner, 'USAGE')
       OR CASE WHEN current_setting('server_version_num')::int >= 170000
               THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END
  FROM pg_class c WHERE c.oid = 'scheduled_jobs'::regclass
"""

# Dead rows by the statistics (updated within a second or so of each
# transaction), and the seconds since any vacuum of the table finished.
_DEAD_ROWS = """
SELECT s.n_dead_tup,
       EXTRACT(EPOCH FROM now() - greatest(s.last_vacuum, s.last_autovacuum))::float8
  FROM pg_stat_user_tables s WHERE s.relid = 'scheduled_jobs'::regclass
"""

# SKIP_LOCKED: a VACUUM of the table already running (another worker's,
# autovacuum's) makes this one a no-op instead of a wait. TRUNCATE false: no
# ACCESS EXCLUSIVE lock at the end, which would stall the claim; autovacuum
# still gives the table's empty tail back. PARALLEL 0: no parallel workers for
# the indexes, whose start-up alone took 50-200 ms a round on a table holding
# a million finished rows, where the whole round took 2-3 ms without them.
_OPTIONS = "SKIP_LOCKED, TRUNCATE false, PARALLEL 0"
# A round that prunes the heap only (INDEX_CLEANUP OFF): it reads the pages
# changed since the last round (the visibility map skips the rest), so it
# costs the same whatever the retention keeps. Each dead version's space is
# freed; its line pointer and its index entries stay until a round with the
# indexes (below). The claim steps over such entries without reading the heap
# once one scan has marked them dead.
_VACUUM_HEAP = f"VACUUM ({_OPTIONS}, INDEX_CLEANUP OFF) scheduled_jobs"
# A round with the indexes as PostgreSQL chooses (INDEX_CLEANUP AUTO): every
# index is read whole when more than 2 % of the heap's pages hold line
# pointers left by pruning, so its cost grows with the finished rows retained.
_VACUUM_INDEXES = f"VACUUM ({_OPTIONS}) scheduled_jobs"

#: How long one VACUUM may take before its connection is closed (seconds).
VACUUM_BOUND = 600.0


class TableVacuumStore:
    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self._may_vacuum = q(_MAY_VACUUM)
        self._dead_rows = q(_DEAD_ROWS)
        self._vacuum_heap = q(_VACUUM_HEAP)
        self._vacuum_indexes = q(_VACUUM_INDEXES)

    async def may_vacuum(self) -> bool:
        """Whether this role may VACUUM the job table."""
        return bool(await self.pool.fetchval(self._may_vacuum))

    async def dead_rows(self) -> tuple[int, float | None]:
        """The job table's dead rows, and the seconds since a vacuum of it
        last finished (None: never, as far as the statistics know)."""
        row = await self.pool.fetchrow(self._dead_rows)
        if row is None:
            return 0, None
        return int(row[0] or 0), row[1]

    async def vacuum(self, indexes: bool) -> None:
        """VACUUM the job table: the heap only, or with its indexes (see above)."""
        stmt = self._vacuum_indexes if indexes else self._vacuum_heap
        await self.pool.execute(stmt, timeout=VACUUM_BOUND)
