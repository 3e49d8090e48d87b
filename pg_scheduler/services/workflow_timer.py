"""Wakes parked workflows whose time has come: a sleep's end, a signal wait's
timeout, a workflow's deadline.

Each round makes the parked rows due within ``lookahead`` seconds pending,
due at their wake time (one statement, at most ``batch`` rows, rows another
worker's timer holds skipped; repeated while full batches come back), and
notifies their queues: a worker then sleeps until that time as for any job
due later, so a workflow wakes at its time, not at the next round. Rows
woken by an event (a signal, a child's end) never wait for this service.
Runs only in a Scheduler that has a workflow registered.
"""

from __future__ import annotations

from ..store.workflows import WorkflowStore
from ..support.log import get_logger
from .base import Service

log = get_logger(__name__)


class WorkflowTimerService(Service):
    name = "workflow_timer"

    def __init__(
        self, store: WorkflowStore, interval: float, lookahead: float, batch: int = 1000
    ) -> None:
        super().__init__(interval)
        if lookahead < interval:
            raise ValueError(f"lookahead ({lookahead}) must be >= the interval ({interval})")
        self.store = store
        self.lookahead = lookahead
        self.batch = batch

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def run_once(self) -> int:
        woken = 0
        while True:
            count = await self.store.wake_due(self.lookahead, self.batch)
            woken += count
            if count < self.batch:
                break
        if woken:
            log.debug("parked workflows due", count=woken)
        return woken
