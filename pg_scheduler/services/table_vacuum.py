"""The library's own VACUUM of ``scheduled_jobs``, every few seconds while it churns.

Every job leaves two dead row versions in the job table (its claim and its
completion). Autovacuum visits a database at most once per
``autovacuum_naptime`` (a minute by default), so between two visits a busy
queue holds a minute of them: 360,000 at 3,000 jobs/s. The claim steps over
the dead entries at the front of its index, and the table and its indexes
grow. So each worker checks the table's statistics every ``interval``
seconds and, once it holds ``MIN_DEAD`` dead rows and no vacuum of it
finished in the last ``interval`` seconds, runs ``VACUUM`` itself. The
statistics are shared, so the workers of a deployment take turns rather than
each vacuuming; a VACUUM already running makes another one a no-op
(SKIP_LOCKED). A worker spaces its own VACUUMs so they take at most a tenth of
its time.

Most rounds prune the heap only, which costs the same however many finished
rows the retention keeps; at most one round a minute per worker also cleans
the indexes (store/table_vacuum.py says what each does).

VACUUM needs the table's owner (PostgreSQL 17: or MAINTAIN on it). A role
without that right leaves the table to autovacuum (logged once, at INFO).
"""

from __future__ import annotations

import time

from ..store.table_vacuum import TableVacuumStore
from ..support.log import get_logger
from .base import Service

log = get_logger(__name__)

#: Fewer dead rows than this are left to autovacuum.
MIN_DEAD = 1000
#: A VACUUM that took t seconds is followed by none for DUTY x t seconds.
DUTY = 9.0
#: A round also cleans the indexes when this worker's last such round is older
#: (seconds; autovacuum's default naptime).
INDEX_EVERY = 60.0


class TableVacuumService(Service):
    name = "table_vacuum"

    def __init__(self, store: TableVacuumStore, interval: float) -> None:
        super().__init__(interval)
        self.store = store
        self.allowed: bool | None = None  # not asked yet
        self.vacuums = 0
        #: Of those, the rounds that also cleaned the indexes.
        self.index_rounds = 0
        self.last_seconds = 0.0
        self._not_before = 0.0
        self._indexes_at: float | None = None  # monotonic time of the last index round

    async def run_once(self) -> bool:
        """VACUUM the job table if it is due; whether it ran."""
        if self.allowed is None:
            self.allowed = await self.store.may_vacuum()
            if not self.allowed:
                log.info(
                    "the job table is left to autovacuum: this role may not VACUUM it",
                    hint="run the workers as the table's owner, or grant MAINTAIN (PostgreSQL 17)",
                )
        if not self.allowed or time.monotonic() < self._not_before:
            return False
        dead, since = await self.store.dead_rows()
        if dead < MIN_DEAD or (since is not None and since < self.interval):
            return False
        started = time.monotonic()
        indexes = self._indexes_at is None or started - self._indexes_at >= INDEX_EVERY
        await self.store.vacuum(indexes)
        took = self.last_seconds = time.monotonic() - started
        self.vacuums += 1
        if indexes:
            self.index_rounds += 1
            self._indexes_at = started
        self._not_before = time.monotonic() + DUTY * took
        log.debug("job table vacuumed", dead_before=dead, indexes=indexes, ms=round(took * 1000, 1))
        return True
