"""Embedding the Scheduler in a FastAPI app's lifespan.

``pip install -e '.[examples]'`` (FastAPI and uvicorn), then run with
``PG_SCHEDULER_DSN=postgresql://... uvicorn examples.fastapi_app:app``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import asyncpg
from fastapi import FastAPI, HTTPException

from examples.app import send_email
from pg_scheduler import Scheduler


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"])
    app.state.scheduler = Scheduler(app.state.pool, max_concurrent_jobs=20)
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
            execution_time=datetime.now(UTC) + timedelta(seconds=delay_seconds),
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
