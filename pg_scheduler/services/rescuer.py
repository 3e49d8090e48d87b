"""Returns the jobs of dead workers to the queue, and reports jobs nobody can run."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..store import Store
from ..support.log import get_logger, newly_reported
from ..support.reconnect import is_connection_error
from .base import Service

log = get_logger(__name__)


class RescuerService(Service):
    name = "rescuer"

    def __init__(
        self,
        store: Store,
        interval: float,
        heartbeat_threshold: Callable[[], float],
        max_rescues: int,
        local_tasks: Callable[[], list[str]],
        report_every: float = 300.0,
    ) -> None:
        super().__init__(interval)
        self.store = store
        self.heartbeat_threshold = heartbeat_threshold
        self.max_rescues = max_rescues
        # Rescues of a job its dead workers held claimed ahead and had not
        # started do not count against max_rescues; this cap still ends a job
        # that kills its worker before a heartbeat reports that it started.
        self.max_unstarted_rescues = max(10, 3 * max_rescues)
        self.local_tasks = local_tasks
        self.report_every = report_every
        self._last_report = float("-inf")
        # After losing the database, this rescuer holds off for a heartbeat
        # threshold: if everyone lost it (a restart, an outage), every lease
        # expired meanwhile, and live workers need a round to heartbeat again
        # before their jobs may be called orphans.
        self._hold_until = float("-inf")

    async def run_once(self) -> int:
        if time.monotonic() < self._hold_until:
            return 0
        try:
            rows = await self.store.rescue_orphans(
                self.heartbeat_threshold(), self.max_rescues, self.max_unstarted_rescues
            )
        except Exception as exc:
            if is_connection_error(exc):
                self._hold_until = time.monotonic() + self.heartbeat_threshold()
            raise
        for row in rows:
            event = "rescued" if row["status"] == "pending" else "failed"
            unstarted = row["unstarted"]
            log.warning(
                "orphaned job " + event,
                event_type=event,
                job_id=row["job_id"],
                task=row["task_name"],
                worker_id=row["old_worker"],
                reason=row["reason"],
                attempt=row["attempts"],
                **({"unstarted": True} if unstarted else {}),
            )
        if time.monotonic() - self._last_report >= self.report_every:
            self._last_report = time.monotonic()
            await self.report_unknown_tasks()
        return len(rows)

    async def report_unknown_tasks(self) -> dict[str, int]:
        unknown = await self.store.unknown_tasks(self.local_tasks(), self.heartbeat_threshold())
        for task_name in newly_reported(("unknown-task", self.store.schema), unknown):
            log.warning(
                "jobs waiting for a task no live worker has registered",
                task=task_name,
                pending=unknown[task_name],
            )
        return unknown
