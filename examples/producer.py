"""Enqueues a steady trickle of example jobs (the docker-compose producer)."""

from __future__ import annotations

import asyncio
import os
import random
from datetime import UTC, datetime, timedelta

import asyncpg

from examples.app import SCHEMA, resize_image, send_email
from pg_scheduler import Scheduler


async def main() -> None:
    pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=4)
    schema = os.environ.get("PG_SCHEDULER_SCHEMA") or SCHEMA
    scheduler = Scheduler(pool, schema=schema)  # never started: a producer only enqueues
    await scheduler.initialize_db()
    n = 0
    while True:
        n += 1
        when = datetime.now(UTC) + timedelta(seconds=random.choice([0, 0, 5, 30]))
        await scheduler.schedule(
            send_email,
            execution_time=when,
            args=(f"user{n}@example.com", "Welcome!"),
            max_retries=3,
        )
        await scheduler.schedule(resize_image, execution_time=when, args=(n,))
        await asyncio.sleep(float(os.environ.get("PRODUCER_INTERVAL", "0.5")))


if __name__ == "__main__":
    asyncio.run(main())
