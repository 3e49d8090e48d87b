"""One statement per interval renews this worker's row and all its leases.

It never waits for a row lock: a running row another session has locked (a
completion of this worker in flight, an operator's open transaction) is
skipped, reported as still held, and renewed by the first heartbeat after the
lock is gone. So a lock held elsewhere never stops the heartbeat (which would
let every lease of the worker expire), and the heartbeat cannot deadlock with
a completion.

The answer doubles as a reconciliation: jobs this worker runs that the
database no longer has running here (cancelled, or rescued after a stall)
are cancelled locally; rows the database has running here that this worker
does not know (a claim whose answer was lost with the connection) are
handed back.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from ..engine import Worker
from ..store import Store
from ..support.log import get_logger
from .base import Service

log = get_logger(__name__)


class HeartbeatService(Service):
    name = "heartbeat"

    def __init__(
        self, store: Store, worker: Worker, interval: float, lease_seconds: Callable[[], float]
    ) -> None:
        super().__init__(interval)
        self.store = store
        self.worker = worker
        self.lease_seconds = lease_seconds
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        # A claim answer lost in flight leaves rows running here that nobody runs;
        # wait this long before calling a row a ghost (a claim may be mid-flight).
        self.ghost_grace = max(2 * interval, 5.0)
        #: Rows the last heartbeat found locked by another session.
        self._skipped: set[str] = set()

    async def run_once(self) -> int:
        started = time.monotonic()
        worker = self.worker
        holdings = worker.heartbeat_view.holdings()
        try:
            # It never waits for a row lock (rows another session holds are
            # reported, not renewed), so it runs beside this worker's
            # completions without ever deadlocking with them.
            rows = await self.store.heartbeat(
                worker.worker_id,
                self.lease_seconds(),
                self.hostname,
                self.pid,
                worker.slots.max_running,
                worker.registry.names(),
                holdings.started_ahead,
            )
        except BaseException:
            worker.heartbeat_view.unreported(holdings)
            raise
        held = {r["job_id"]: r for r in rows}
        skipped = [r["job_id"] for r in rows if not r["renewed"]]
        # A row locked for a moment (this worker's own completion in flight)
        # is normal; one locked across two heartbeats is worth a line.
        stuck = [job_id for job_id in skipped if job_id in self._skipped]
        self._skipped = set(skipped)
        if stuck:
            log.warning(
                "lease not renewed: another session holds the row lock",
                jobs=len(stuck),
                job_ids=stuck[:10],
                worker_id=worker.worker_id,
            )
        if skipped:
            # Their starts are reported with the next heartbeat that renews them.
            if holdings.started_ahead:
                again = set(skipped)
                holdings.started_ahead = [j for j in holdings.started_ahead if j in again]
                worker.heartbeat_view.unreported(holdings)
        ghosts = worker.heartbeat_view.reconcile(
            held, holdings, started, self.ghost_grace, self._lease_lost
        )
        if ghosts:
            # Guarded by the claim the heartbeat saw: its answer is a moment old,
            # and a row handed back meanwhile may be claimed here again already.
            claims = {job_id: held[job_id]["started_at"] for job_id in ghosts}
            released = await self.store.release_ghosts(worker.worker_id, claims)
            if released:
                log.warning("released claims this worker never started", jobs=released)
        return len(rows)

    def _lease_lost(self, job_id: str) -> None:
        log.warning(
            "job no longer held by this worker; stopped it",
            job_id=job_id,
            worker_id=self.worker.worker_id,
        )
