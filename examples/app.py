"""An example application: tasks, a periodic job, and worker settings.

Run a worker for it with ``pg-scheduler worker examples.app:SETTINGS``.

The examples keep their tables in a schema of their own, ``examples``: what
they leave behind (their periodic job, jobs scheduled for a worker you
stopped) never mixes with your own application's jobs in ``public``. Look at
it with ``pg-scheduler --schema examples status``; drop it with
``DROP SCHEMA examples CASCADE``.
"""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

from pg_scheduler import RetryPolicy, periodic, task


@task(name="example.send_email")
async def send_email(recipient: str, subject: str) -> dict[str, str]:
    await asyncio.sleep(random.uniform(0.01, 0.1))  # stands in for an SMTP call
    return {"recipient": recipient, "subject": subject}


@task(name="example.resize_image")
async def resize_image(image_id: int) -> int:
    await asyncio.sleep(0.05)
    return image_id


@periodic(every=timedelta(minutes=1), job_name="cleanup_sessions")
async def cleanup_sessions() -> None:
    await asyncio.sleep(0.01)


#: The examples' own schema (``$PG_SCHEDULER_SCHEMA`` or ``--schema`` overrides it).
SCHEMA = "examples"

SETTINGS = {
    "schema": SCHEMA,
    "max_concurrent_jobs": 50,
    "batch_claim_limit": 50,
    "retry_policy": RetryPolicy(base_delay=5, factor=2, max_delay=300),
    "shutdown_grace_period": 20,
}
