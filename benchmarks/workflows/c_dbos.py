"""DBOS Transact (PyPI ``dbos``), in its own virtualenv, written as its
documentation shows: ``@DBOS.workflow()`` and ``@DBOS.step()`` on async
functions, a registered queue for concurrency (``worker_concurrency``),
``DBOS.recv_async`` / ``DBOS.send_bulk_async`` for waiting on and sending
messages, and workflows enqueued from a parent workflow for fan-out.

Its system database is the scenario's fresh database on the same server.
"""

from __future__ import annotations

import asyncio
import logging
from importlib.metadata import version
from typing import Any

import asyncpg
from dbos import DBOS, SendMessage

RECORD: Any = None
QUEUE = "wfbench"
# How often DBOS's queue worker and a handle's get_result poll (set from the
# harness's --dbos-polling; DBOS's default is 1 s for both).
POLL = 0.01


@DBOS.step()
async def noop_step(i: int, k: int) -> int:
    RECORD.step(i, k)
    return i + k


@DBOS.workflow()
async def steps_wf(i: int, steps: int) -> int:
    RECORD.enter(i)
    try:
        total = 0
        for k in range(steps):
            total += await noop_step(i, k)
        RECORD.finish(i, total)
        return total
    finally:
        RECORD.leave(i)


@DBOS.workflow()
async def plain_wf(i: int) -> int:
    RECORD.enter(i)
    try:
        RECORD.finish(i, i)
        return i
    finally:
        RECORD.leave(i)


@DBOS.workflow()
async def parked_wf(i: int) -> Any:
    RECORD.enter(i)
    try:
        RECORD.waiting(i)
        payload = await DBOS.recv_async("go", timeout_seconds=3600)
        RECORD.finish(i, payload)
        return payload
    finally:
        RECORD.leave(i)


@DBOS.workflow()
async def child_wf(i: int) -> int:
    RECORD.child(i)
    return i


@DBOS.workflow()
async def parent_wf(n: int) -> int:
    RECORD.parent_enter()
    handles = [await DBOS.enqueue_workflow_async(QUEUE, child_wf, i) for i in range(n)]
    results = [await h.get_result(polling_interval_sec=POLL) for h in handles]
    RECORD.resumed()
    total = sum(results)
    RECORD.finish(0, total)
    return total


async def _in_chunks(calls: list[Any], width: int = 50) -> list[Any]:
    """Await the coroutines ``width`` at a time (each is a database round trip)."""
    out: list[Any] = []
    for start in range(0, len(calls), width):
        out += await asyncio.gather(*calls[start : start + width])
    return out


class Contender:
    version = f"dbos {version('dbos')}"

    def __init__(self, dsn: str, record: Any, cfg: dict[str, Any]) -> None:
        global RECORD, POLL
        RECORD = record
        POLL = float(cfg.get("dbos_polling", POLL))
        self.dsn = dsn
        self.conn: asyncpg.Connection | None = None
        self.parked_ids: dict[int, str] = {}
        self.queue: Any = None

    async def setup(self) -> None:
        logging.getLogger("dbos").setLevel(logging.WARNING)
        DBOS(config={"name": "wfbench", "system_database_url": self.dsn, "log_level": "WARNING"})
        DBOS.launch()
        self.conn = await asyncpg.connect(self.dsn)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
        await asyncio.to_thread(DBOS.destroy)

    def settings(self, cfg: dict[str, Any]) -> dict[str, Any]:
        return {
            "queue": (
                f"register_queue({QUEUE!r}, worker_concurrency={cfg['concurrency']}, "
                f"polling_interval_sec={POLL})"
            ),
            "get_result_polling_interval_sec": POLL,
            "system_database": "the scenario's database, DBOS defaults otherwise",
        }

    async def start_worker(self, concurrency: int, queue: bool = True) -> None:
        """DBOS runs from launch; the queue starts dequeuing once registered
        (its manager thread looks for new queues once a second)."""
        if queue and self.queue is None:
            self.queue = await DBOS.register_queue_async(
                QUEUE, worker_concurrency=concurrency, polling_interval_sec=POLL
            )

    async def stop_worker(self) -> None:
        return None

    async def run_one(self, i: int, steps: int) -> int:
        handle = await DBOS.start_workflow_async(steps_wf, i, steps)
        return await handle.get_result()

    async def enqueue_workflows(self, ids: range, steps: int) -> None:
        await _in_chunks([DBOS.enqueue_workflow_async(QUEUE, steps_wf, i, steps) for i in ids])

    async def enqueue_plain(self, ids: range) -> None:
        await _in_chunks([DBOS.enqueue_workflow_async(QUEUE, plain_wf, i) for i in ids])

    async def start_parked(self, ids: range) -> None:
        """Started directly, not on the queue: a queue's worker_concurrency
        counts a waiting workflow, so 10,000 could not all wait at once."""
        handles = await _in_chunks([DBOS.start_workflow_async(parked_wf, i) for i in ids])
        self.parked_ids = {i: h.get_workflow_id() for i, h in zip(ids, handles, strict=True)}

    async def wait_parked(self, n: int, timeout: float) -> bool:
        return True  # a waiting DBOS workflow stays in memory: nothing more to wait for

    async def signal_all(self, ids: range) -> None:
        messages = [SendMessage(self.parked_ids[i], i, "go") for i in ids]
        for start in range(0, len(messages), 1000):
            await DBOS.send_bulk_async(messages[start : start + 1000])

    async def start_fanout(self, n: int) -> Any:
        return await DBOS.start_workflow_async(parent_wf, n)

    async def fanout_result(self, handle: Any) -> Any:
        return await handle.get_result(polling_interval_sec=POLL)

    async def completed_count(self) -> int:
        assert self.conn is not None
        return await self.conn.fetchval(
            "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
        )

    async def running_rows(self) -> int:
        """Workflows the database counts as executing (PENDING)."""
        assert self.conn is not None
        return await self.conn.fetchval(
            "SELECT count(*) FROM dbos.workflow_status WHERE status = 'PENDING'"
        )

    def pool_in_use(self) -> int | None:
        """Connections checked out of DBOS's system-database pool (SQLAlchemy)."""
        try:
            from dbos._dbos import _get_dbos_instance

            return int(_get_dbos_instance()._sys_db.engine.pool.checkedout())
        except Exception:
            return None
