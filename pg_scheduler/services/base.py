"""The one shape every background loop has: run_once every interval, until stopped."""

from __future__ import annotations

import asyncio
from typing import Any

from ..support.log import get_logger
from ..support.reconnect import is_connection_error, is_rolled_back_conflict

log = get_logger(__name__)


class Service:
    """Calls :meth:`run_once` every :attr:`interval` seconds; an error never ends the loop."""

    name = "service"

    def __init__(self, interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"{self.name} interval must be > 0, got {interval}")
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._first_after = 0.0

    async def run_once(self) -> Any:
        raise NotImplementedError

    def start(self, *, first_after: float = 0.0) -> None:
        """Run rounds until stopped, the first ``first_after`` seconds from now
        (off the start-up path, or an interval after a round the caller ran)."""
        self._stop.clear()
        self._first_after = first_after
        self._task = asyncio.create_task(self.run_forever(), name=f"pg_scheduler.{self.name}")

    async def run_forever(self) -> None:
        if self._first_after > 0:
            try:
                await asyncio.wait_for(self._stop.wait(), self._first_after)
            except TimeoutError:
                pass
        while not self._stop.is_set():
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if is_rolled_back_conflict(exc):
                    # A deadlock with this worker's own writes (the heartbeat
                    # and a completion batch): the next round runs it again.
                    log.warning(
                        "service round rolled back by a lock conflict",
                        service=self.name,
                        error=repr(exc),
                    )
                elif is_connection_error(exc):
                    log.warning(
                        "service round failed: database unreachable",
                        service=self.name,
                        error=repr(exc),
                    )
                else:
                    log.exception("service round failed", service=self.name)
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval)
            except TimeoutError:
                pass

    async def stop(self) -> None:
        self._stop.set()
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
