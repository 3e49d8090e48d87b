"""The start of a run: its records, read together with the runs starting beside it.

A claim starts a batch of jobs at once; each workflow among them needs its
records before its function runs. Those of a run that started before (a
resumed workflow) come with the claim itself (``RESUME_COLUMNS`` in
store/workflow_sql.py); the loader reads the others': a first run's (its
incarnation and deadline) and those of rows started by a statement that
returns none (an in-process start, a dependent handed over at completion).

Each run asks :class:`Loader` for its own; the requests made while the
event loop goes round once (and while a read is in flight) are read in one
statement (``WorkflowStore.load_many``), so a batch of first runs costs one
round trip, not one each. A run alone waits one turn of the loop for company.
"""

from __future__ import annotations

import asyncio

from ..store.workflows import Loaded, WorkflowStore
from ..support.reconnect import retry_on_disconnect
from .run import WRITE_PATIENCE


class Loader:
    """Reads the records of runs of one store's workflows, many per statement."""

    __slots__ = ("_flight", "_queued", "_store", "_turn")

    def __init__(self, store: WorkflowStore) -> None:
        self._store = store
        self._queued: dict[str, list[asyncio.Future[Loaded | None]]] = {}
        self._turn = False  # a read is due at the next turn of the loop
        self._flight: asyncio.Task[None] | None = None

    async def load(self, job_id: str) -> Loaded | None:
        """``job_id``'s records (None: the job is gone)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Loaded | None] = loop.create_future()
        self._queued.setdefault(job_id, []).append(future)
        if not self._turn and self._flight is None:
            self._turn = True
            loop.call_soon(self._start)
        return await future

    def _start(self) -> None:
        self._turn = False
        if self._flight is not None or not self._queued:
            return
        batch, self._queued = self._queued, {}
        self._flight = asyncio.ensure_future(self._read(batch))

    async def _read(self, batch: dict[str, list[asyncio.Future[Loaded | None]]]) -> None:
        store = self._store
        try:
            found = await retry_on_disconnect(
                lambda: store.load_many(store.pool, list(batch)),
                what="load workflows",
                give_up_after=WRITE_PATIENCE,
            )
        except BaseException as exc:  # every run of the batch fails as its own read would
            for futures in batch.values():
                for future in futures:
                    if future.done():
                        continue
                    if isinstance(exc, asyncio.CancelledError):
                        future.cancel()
                    else:
                        future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for job_id, futures in batch.items():
                for future in futures:
                    if not future.done():
                        future.set_result(found.get(job_id))
        finally:
            self._flight = None
            if self._queued:
                self._start()
