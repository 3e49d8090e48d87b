"""One statement per interval renews this worker's row and all its leases.

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

from ..log import get_logger
from ..store import Store
from ..worker import LEASE_LOST, Worker
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

    async def run_once(self) -> int:
        started = time.monotonic()
        claims_sent = self.worker.claims_sent
        quiet = self.worker.claims_in_flight == 0
        rows = await self.store.heartbeat(
            self.worker.worker_id,
            self.lease_seconds(),
            self.hostname,
            self.pid,
            self.worker.max_concurrent_jobs,
            self.worker.registry.names(),
        )
        held = {r["job_id"]: r for r in rows}
        for job_id, running in list(self.worker.running.items()):
            if job_id not in held and running.claimed_at < started:
                if self.worker.cancel_local(job_id, LEASE_LOST):
                    log.warning(
                        "job no longer held by this worker; stopped it",
                        job_id=job_id,
                        worker_id=self.worker.worker_id,
                    )
        # No claim overlapped this statement: every claim that it can see was
        # answered before it was sent, so a row not owned here is a ghost now
        # (after a database restart, say), without waiting for the grace.
        settled = quiet and self.worker.claims_sent == claims_sent
        ghosts = [
            job_id
            for job_id, r in held.items()
            if job_id not in self.worker.owned
            and (settled or (r["running_for"] or 0) > self.ghost_grace)
        ]
        if ghosts:
            released = await self.store.release(self.worker.worker_id, ghosts)
            log.warning("released claims this worker never started", jobs=released)
        return len(rows)
