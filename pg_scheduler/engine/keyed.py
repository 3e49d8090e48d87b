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

With many keys, visiting every key in each claim to find the most urgent
ones costs more than the claim itself (about 3 ms for 1,000 keys). A worker
that sees at least ``LIST_MIN`` keys then reads the list of keys with
pending work, most urgent first, each with its head's limits, about once a
second (``LIST_TTL``), and each claim visits the keys of that list from
where the previous one stopped, going round it again from its start when
it reaches the end. A claim locks the first keys of its stretch whose room
(estimated from the listed limits) is not gone, then reads their heads,
room and limits live under the locks, so the limits stay exact. What that
costs: a key that gets due work after the list was read waits for the next
list (at most ``LIST_TTL``); a key whose job ends after the claims went past
it waits for their next round; the keys with work are served in turn.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import cast

import asyncpg

from ..store.bounded import BoundedPool
from ..store.keys import KeyStore, ListedKey
from ..store.names import Executor
from .rate_starts import RateStarts

#: How long a worker that saw no due keyed work goes without a first look
#: (the plain claim may be busy with a backlog meanwhile).
REFRESH = 1.0
#: Claims visit a list of the keys (read at most ``LIST_TTL`` seconds ago)
#: while it holds at least ``LIST_MIN`` of them; at most ``LIST_SIZE``.
LIST_MIN = 100
LIST_TTL = 1.0
LIST_SIZE = 10_000
#: A claim that visits the list locks the keys of its next stretch (at most
#: ``VISIT_WINDOW`` keys per row it has room for) whose room is not gone, as
#: many as it has room for rows plus a quarter (at least ``VISIT_MARGIN``).
VISIT_WINDOW = 4
VISIT_MARGIN = 8


class KeyedClaims:
    """Claims keyed jobs; knows whether keyed work was due at the last look."""

    def __init__(self, store: KeyStore, rate_starts: RateStarts) -> None:
        self.store = store
        #: Where the claim's send time of each rate-limited row goes.
        self.rate_starts = rate_starts
        #: Keys with due work and room (as read before their locks) at the last claim.
        self.seen = 0
        self._looked_at = float("-inf")
        #: The list as read, the keys the next claims visit (in order), and when
        #: the list was read.
        self._whole: list[ListedKey] = []
        self._list: list[ListedKey] = []
        self._listed_at = float("-inf")
        #: Whether claims visit the list (it held LIST_MIN keys or more).
        self._listing = False

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
        conn = cast(asyncpg.Connection, db)
        listed = await self._keys(conn)
        window = None if listed is None else listed[: VISIT_WINDOW * room]
        sent = time.monotonic()
        rows, seen, _, reach = await self.store.claim(
            conn,
            limit=room,
            tasks=names,
            queues=served,
            worker_id=worker_id,
            lease_seconds=lease_seconds,
            cut=cut,
            start_now=start_now,
            listed=window,
            visit=room + max(VISIT_MARGIN, room // 4),
        )
        if rows:
            self.rate_starts.claimed(rows, sent)
        if window is not None:
            gone = reach
            if len(rows) >= room:
                # Full: the next claim goes on after the last key this one
                # took (the keys past it were not read for want of room).
                taken = {r["claimed_key"] for r in rows}
                gone = 1 + max(i for i, k in enumerate(window) if k.key in taken)
            self._list = self._list[max(gone, 1) :]
        self.seen = len(seen)
        self._looked_at = time.monotonic()
        return rows

    async def _keys(self, conn: asyncpg.Connection) -> list[ListedKey] | None:
        """The keys the next claim visits (None: every key, in the claim itself)."""
        now = time.monotonic()
        if now - self._listed_at >= LIST_TTL:
            keys = await self.store.key_list(conn, LIST_SIZE)
            self._listed_at = now
            self._listing = len(keys) >= LIST_MIN
            self._whole = keys if self._listing else []
            self._list = self._whole
        elif self._listing and not self._list:
            self._list = self._whole  # the list visited to its end: again from its start
        return self._list if self._listing else None
