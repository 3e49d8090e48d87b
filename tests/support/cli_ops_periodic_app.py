"""A @periodic job for the CLI trigger test; imported only by CLI subprocesses."""

from __future__ import annotations

from datetime import timedelta

from pg_scheduler import periodic


@periodic(every=timedelta(hours=1), dedup_key="cli-ops-hourly", job_name="cli_ops_hourly")
async def cli_ops_hourly() -> str:
    return "ran"
