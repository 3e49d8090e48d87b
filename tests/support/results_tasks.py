"""Tasks for tests/system/test_results.py (imported by its worker subprocesses too)."""

from __future__ import annotations

import asyncio
import os

from pg_scheduler import current_job, task


@task(name="results.echo")
async def echo(value: object = None) -> object:
    return value


@task(name="results.boom")
async def boom(text: str) -> None:
    raise ValueError(f"{text} in pid {os.getpid()}")


@task(name="results.fail_until")
async def fail_until(attempts_needed: int) -> str:
    if current_job().attempt < attempts_needed:
        raise RuntimeError(f"attempt {current_job().attempt} failed on purpose")
    return "ok"


@task(name="results.context")
async def context() -> dict:
    job = current_job()
    return {
        "job_id": job.job_id,
        "attempt": job.attempt,
        "task": job.task,
        "queue": job.queue,
        "scheduled_at": job.scheduled_at.isoformat(),
        "cancelled": job.cancelled(),
    }


@task(name="results.progress_storm")
async def progress_storm(reports: int, seconds: float) -> int:
    # ``reports`` progress reports spread over about ``seconds``.
    job = current_job()
    loop = asyncio.get_running_loop()
    start = loop.time()
    for n in range(1, reports + 1):
        await job.report_progress(n / reports, f"step {n}")
        if n % 100 == 0:
            behind = start + seconds * n / reports - loop.time()
            await asyncio.sleep(max(0.0, behind))
    return reports


@task(name="results.wait_cancel")
async def wait_cancel(key: str) -> None:
    await asyncio.Event().wait()  # until cancel_job()


@task(name="results.progress_no_wait")
async def progress_no_wait() -> str:
    current_job().set_progress(0.25, "a quarter")  # from async code, without awaiting
    return "returned"


@task(name="results.progress_bad_text")
async def progress_bad_text() -> list[str]:
    # Each refused message raises at the call; the good report after them is written.
    job = current_job()
    refused = []
    for message in ("nul \x00 inside", "lone \ud800 surrogate"):
        try:
            await job.report_progress(0.5, message)
        except ValueError as exc:
            refused.append(str(exc))
        try:
            job.set_progress(0.5, message)
        except ValueError as exc:
            refused.append(str(exc))
    await job.report_progress(0.75, "fine")
    return refused
