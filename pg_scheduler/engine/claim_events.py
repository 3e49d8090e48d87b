"""The claim's events: the claim statement sends none (migration 0010), so
the claim loop sends "expired" for rows the claim expired, and "started" for
the rows it claimed while some subscriber wants that kind.

Whether one does is read from ``scheduler_event_flags`` at most every
``REFRESH`` seconds, and again after a subscriber asks (its ``want_kinds``
notifies the jobs channel with the payload ``events``): with no subscriber a
claim costs nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..store import Store
from ..store.names import Executor

REFRESH = 10.0


class ClaimEvents:
    def __init__(self, store: Store, worker_id: str) -> None:
        self.store = store
        self.worker_id = worker_id
        self._started_until = 0.0  # time.monotonic() until which "started" is wanted
        self._read_at: float | None = None

    async def read_flags(self, db: Executor) -> None:
        """Read which flagged kinds are wanted (start-up does it before the first claim)."""
        wanted = await self.store.wanted_kinds(db)
        self._read_at = time.monotonic()
        self._started_until = self._read_at + wanted.get("started", -1.0)

    def flags_changed(self) -> None:
        """A subscriber asked for events: read the flags before the next claim's events."""
        self._read_at = None

    async def send(self, db: Executor, rows: Sequence[Mapping[str, Any]]) -> None:
        """Before the claimed rows start: their events, if any are due."""
        if not rows:
            return
        if self._read_at is None or time.monotonic() - self._read_at > REFRESH:
            await self.read_flags(db)
        now = time.monotonic()
        expired = [r for r in rows if r["status"] == "expired"]
        if expired:
            await self.store.emit_events(db, "expired", expired, self.worker_id)
        if now < self._started_until and len(expired) < len(rows):
            started = [r for r in rows if r["status"] != "expired"]
            await self.store.emit_events(db, "started", started, self.worker_id)
