"""The raw limit: the least database work a durable queue does per job, as a contender.

Same shape as ``../shared/tools/raw_limit.py`` measures outside the harness: a
narrow table with one partial index for the claim; a worker that claims a
batch with ``FOR UPDATE SKIP LOCKED`` (the claim commits asynchronously, as
pg_scheduler's does) and acknowledges it in one statement on a second
connection while the next claim runs. The acknowledgement is an UPDATE to
``done`` (pg_scheduler's default keeps completed rows), or a DELETE with
``RAW_LIMIT_ACK=delete`` (variant ``raw_limit_del``). The only per-job Python
work is the harness's bookkeeping call. NOTIFY on insert wakes an idle
worker, so the latency scenario measures the same path.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

RECORD: Any = None
ACK = os.environ.get("RAW_LIMIT_ACK", "update")

_TABLE = """
CREATE TABLE IF NOT EXISTS raw_queue (
    id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    n        BIGINT NOT NULL,
    priority SMALLINT NOT NULL DEFAULT 0,
    run_at   TIMESTAMPTZ NOT NULL,
    state    TEXT NOT NULL DEFAULT 'ready',
    taken_at TIMESTAMPTZ,
    done_at  TIMESTAMPTZ
)"""
_INDEX = """
CREATE INDEX IF NOT EXISTS raw_queue_ready ON raw_queue (priority, run_at) WHERE state = 'ready'
"""
_TAKE = """
UPDATE raw_queue q SET state = 'taken', taken_at = now()
  FROM (SELECT id FROM raw_queue WHERE state = 'ready' AND run_at <= now()
         ORDER BY priority, run_at LIMIT $1 FOR UPDATE SKIP LOCKED) t
 WHERE q.id = t.id
RETURNING q.id, q.n"""
_DONE = {
    "update": "UPDATE raw_queue SET state = 'done', done_at = now() WHERE id = ANY($1::bigint[])",
    "delete": "DELETE FROM raw_queue WHERE id = ANY($1::bigint[])",
}[ACK]
_ONE = """
WITH i AS (INSERT INTO raw_queue (n, run_at) VALUES ($1, $2)) SELECT pg_notify('raw_queue', '')
"""


class Contender:
    version = f"raw limit (claim + one-statement {ACK} per batch, no library)"
    # The two statements the worker loop runs (a variant swaps the table).
    take_sql = _TAKE
    done_sql = _DONE
    wake_channel = "raw_queue"

    def __init__(self, dsn: str, record: Any) -> None:
        global RECORD
        RECORD = record
        self.dsn = dsn
        self.pool: asyncpg.Pool | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._batch = 50

    async def setup(self) -> None:
        self.pool = await asyncpg.create_pool(self.dsn, min_size=2, max_size=6)
        await self.pool.execute(_TABLE)
        await self.pool.execute(_INDEX)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    async def _copy(self, ids: range, when: datetime) -> None:
        assert self.pool is not None
        async with self.pool.acquire() as conn:
            await conn.copy_records_to_table(
                "raw_queue", records=((i, when) for i in ids), columns=["n", "run_at"]
            )
            await conn.execute("NOTIFY raw_queue")

    async def enqueue_due(self, ids: range) -> None:
        await self._copy(ids, datetime.now(UTC) - timedelta(seconds=1))

    async def enqueue_future(self, ids: range) -> None:
        await self._copy(ids, datetime.now(UTC) + timedelta(hours=1))

    async def enqueue_one(self, i: int, future: bool = False) -> None:
        assert self.pool is not None
        when = datetime.now(UTC) + (timedelta(hours=1) if future else timedelta(0))
        await self.pool.execute(_ONE, i, when)

    async def analyze(self) -> None:
        assert self.pool is not None
        await self.pool.execute("ANALYZE raw_queue")

    async def count_jobs(self) -> int:
        assert self.pool is not None
        return await self.pool.fetchval("SELECT count(*) FROM raw_queue")

    async def remaining(self) -> int:
        assert self.pool is not None
        return await self.pool.fetchval(
            "SELECT count(*) FROM raw_queue WHERE state <> 'done' AND run_at <= now()"
        )

    async def prepare_worker(self, concurrency: int) -> None:
        self._batch = concurrency

    async def start_worker(self, concurrency: int) -> None:
        self._batch = concurrency
        self._stop.clear()
        self._task = asyncio.create_task(self._work())

    async def stop_worker(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def _work(self) -> None:
        assert self.pool is not None
        async with (
            self.pool.acquire() as take,
            self.pool.acquire() as ack,
            self.pool.acquire() as ear,
        ):
            await take.execute("SET synchronous_commit = off")

            def heard(*_: object) -> None:
                self._wake.set()

            await ear.add_listener(self.wake_channel, heard)
            in_flight: asyncio.Future[Any] | None = None
            while not self._stop.is_set():
                self._wake.clear()
                rows = await take.fetch(self.take_sql, self._batch)
                if in_flight is not None:
                    await in_flight
                    in_flight = None
                if not rows:
                    # Idle: a NOTIFY wakes it; a short poll covers a missed one.
                    try:
                        await asyncio.wait_for(self._wake.wait(), 0.05)
                    except TimeoutError:
                        pass
                    continue
                ran = RECORD.ran
                for row in rows:
                    ran(row[1])
                in_flight = asyncio.ensure_future(
                    ack.execute(self.done_sql, [row[0] for row in rows])
                )
            if in_flight is not None:
                await in_flight
            await ear.remove_listener(self.wake_channel, heard)
