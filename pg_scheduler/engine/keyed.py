"""The claim for keyed jobs (``concurrency_key``; see :mod:`pg_scheduler.store.keys`).

The plain claim never takes keyed rows. While keyed work was seen lately
(and at least every ``REFRESH`` seconds otherwise), each turn of the claim
loop first claims keyed work at least as urgent as the most urgent due plain
job (so priority orders the two), then the plain claim runs (only what
starts now while such keyed work waits: nothing claimed ahead of it); when
the plain claim comes back short, keyed work of any priority gets the free
slots. A keyed claim fills the worker's buffer too (a buffered row holds
its key's slot until it starts or is handed back), except with rows of
rate-limited keys: those are taken only as many as start at once, so that
a start is stamped when it happens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import cast

import asyncpg

from ..store.bounded import BoundedPool
from ..store.keys import KeyStore
from ..store.names import Executor

#: How long a worker that saw no due keyed work goes without a first look
#: (the plain claim may be busy with a backlog meanwhile).
REFRESH = 1.0


class KeyedClaims:
    """Claims keyed jobs; knows whether keyed work was due at the last look."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store
        #: Keys with due work and room (as read before their locks) at the last claim.
        self.seen = 0
        #: Whether a key another claim held had due work at the last claim.
        self.held = False
        self._looked_at = float("-inf")

    @property
    def active(self) -> bool:
        """Whether the claim loop looks for keyed work before the plain claim:
        keyed work was due at the last look, or that look is over ``REFRESH`` old."""
        return self.seen > 0 or time.monotonic() - self._looked_at >= REFRESH

    async def claim(
        self,
        db: Executor,
        *,
        names: Sequence[str],
        served: Sequence[str] | None,
        caps: Sequence[int] | None = None,
        room: int,
        worker_id: str,
        lease_seconds: float,
        cut: bool,
        start_now: int | None = None,
    ) -> list[asyncpg.Record]:
        """Up to ``room`` keyed jobs of ``names`` in ``served`` (None: every
        queue; ``caps``, the room of each, is not applied to keyed jobs);
        ``cut``: only those at least as urgent as the due plain work;
        ``start_now``: past these, rows are claimed ahead (not rate-limited ones)."""
        if isinstance(db, asyncpg.Pool | BoundedPool):  # the transaction needs one connection
            async with db.acquire() as conn:
                return await self.claim(
                    conn,
                    names=names,
                    served=served,
                    room=room,
                    worker_id=worker_id,
                    lease_seconds=lease_seconds,
                    cut=cut,
                    start_now=start_now,
                )
        rows, seen, held = await self.store.claim(
            cast(asyncpg.Connection, db),
            limit=room,
            tasks=names,
            queues=served,
            worker_id=worker_id,
            lease_seconds=lease_seconds,
            cut=cut,
            start_now=start_now,
        )
        self.seen = seen
        self.held = held is not None
        self._looked_at = time.monotonic()
        return rows
