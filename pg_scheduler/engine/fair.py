"""When the worker claims with the fair claim (weighted fair share, migration 0018).

While no row with a fair share key is pending, the worker's claims are the
plain ones and pay nothing for fair share. Whether keyed rows are pending is
read from the database at most every ``REFRESH`` seconds, and at once when a
claim found nothing (a NOTIFY for a keyed row wakes the worker so). While it
is on, every claim is the fair one (store/fair_sql.py), which takes unkeyed
rows too, as one more key of weight 1, and the worker also asks when the
next keyed job is due. A stale "on" only costs the fair claim's price; a
stale "off" delays keyed work by at most ``REFRESH``, never loses it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from ..store.fair import FairStore
from ..store.names import Executor

#: How stale the "keyed rows are pending" flag may get.
REFRESH = 1.0
#: How often a worker deletes record rows that have decayed to nothing.
FORGET_EVERY = 30.0


class FairClaims:
    """Knows whether keyed work is pending; gives the fair claim's next due time."""

    def __init__(self, store: FairStore) -> None:
        self.store = store
        self.active = False
        self._loaded_at = float("-inf")
        self._forgot_at = time.monotonic()

    def stale(self) -> bool:
        return time.monotonic() - self._loaded_at >= REFRESH

    async def refresh(self, db: Executor, *, now: bool = False) -> None:
        """Read whether keyed rows are pending (``now``: whatever the last read's age)."""
        if not now and not self.stale():
            return
        self.active = await self.store.pending(db)
        self._loaded_at = time.monotonic()
        if self.active and time.monotonic() - self._forgot_at >= FORGET_EVERY:
            self._forgot_at = time.monotonic()
            await self.store.forget_old_starts(db)

    async def next_due(
        self, db: Executor, names: Sequence[str], queues: Sequence[str] | None
    ) -> float | None:
        """Seconds until the next keyed job is due (None: none, or the claim is off)."""
        if not self.active:
            return None
        return await self.store.seconds_until_next_due(db, names, queues)

    async def after_claim(
        self,
        run: Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]],
        claimed: bool,
        due_in: float | None,
        names: Sequence[str],
        queues: Sequence[str] | None,
    ) -> tuple[bool, float | None]:
        """After a claim that came back short (``run``: runs a call on the claim
        loop's connection): whether to claim again at once (it found nothing,
        and keyed work turned out to be pending: a NOTIFY for it woke the
        worker), and ``due_in`` made sooner if keyed work is due sooner."""
        if not self.active and not claimed:
            await run(partial(self.refresh, now=True))
            if self.active:
                return True, due_in
        if not self.active:
            return False, due_in
        fair_due = await run(partial(self.next_due, names=names, queues=queues))
        if fair_due is None:
            return False, due_in
        return False, fair_due if due_in is None else min(due_in, fair_due)
