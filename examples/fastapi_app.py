"""Embedding the Scheduler in a FastAPI app's lifespan.

``pip install -e '.[examples,embedded]'`` (FastAPI and uvicorn) in a clone of
the repository, then run ``uvicorn examples.fastapi_app:app``: on
``$PG_SCHEDULER_DSN`` if set, else on the embedded PostgreSQL (started if
needed), as the Quick start does. Its jobs live in the examples' own schema
(``pg-scheduler --schema examples status``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import asyncpg
from fastapi import FastAPI, HTTPException

from examples.app import SCHEMA, send_email
from pg_scheduler import Scheduler
from pg_scheduler.embedded import default_dsn


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # $PG_SCHEDULER_DSN, else the embedded PostgreSQL (started if needed).
    dsn = await asyncio.to_thread(default_dsn)
    app.state.pool = await asyncpg.create_pool(dsn)
    schema = os.environ.get("PG_SCHEDULER_SCHEMA") or SCHEMA
    app.state.scheduler = Scheduler(app.state.pool, max_concurrent_jobs=20, schema=schema)
    await app.state.scheduler.start()
    try:
        yield
    finally:
        await app.state.scheduler.shutdown()
        await app.state.pool.close()


app = FastAPI(lifespan=lifespan)


@app.post("/emails")
async def schedule_email(recipient: str, delay_seconds: float = 0) -> dict[str, str]:
    # Enqueue in the same transaction as the request's own writes: the email
    # job exists only if the signup commits.
    async with app.state.pool.acquire() as conn, conn.transaction():
        job_id = await app.state.scheduler.schedule(
            send_email,
            delay=timedelta(seconds=delay_seconds),
            args=(recipient, "Welcome!"),
            max_retries=3,
            connection=conn,
        )
    return {"job_id": job_id}


@app.get("/jobs/{job_id}")
async def job_status(job_id: str) -> dict[str, object]:
    job = await app.state.scheduler.get_job(job_id)
    if job is None:
        raise HTTPException(status_code=404, detail="no such job")
    return {"status": job.status.value, "result": job.result, "attempts": job.attempts}
