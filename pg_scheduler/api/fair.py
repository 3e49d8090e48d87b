"""The Scheduler's fair share between keys (docs: Fair share between tenants):
weights set per key, and the busiest keys for operators. A part of
:class:`~pg_scheduler.Scheduler`; the checks are in ``enqueue/fair.py``, the
SQL in ``store/fair_sql.py``."""

from __future__ import annotations

from typing import Any

from ..enqueue.fair import check_fair_share_key, check_fair_share_weight
from ..store.fair import FairStore
from ..support.validation import check_int


class FairShare:
    """Set and clear the weight of a key; list the busiest keys."""

    def __init__(self, store: FairStore) -> None:
        self.store = store

    async def set_weight(self, key: str, weight: float | None) -> None:
        """Key ``key``'s weight from now on, for every job of it (None: each
        job's own weight again, else 1). Checked before anything is written."""
        if key is None:
            raise TypeError("fair_share_key must be a str, got None")
        check_fair_share_key(key)
        check_fair_share_weight(weight)
        await self.store.set_weight(key, None if weight is None else float(weight))

    async def busiest(self, limit: int = 10) -> list[dict[str, Any]]:
        """The ``limit`` busiest keys, by running jobs plus recent starts."""
        check_int("limit", limit, 1)
        return [dict(r) for r in await self.store.busiest(limit)]
