"""Small things a first hour trips over: ``retry`` of an unknown id says one
thing, the sync client waits for results, durations in messages read as
people write them."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from pg_scheduler import JobCancelled, JobFailed, JobNotFound, SyncClient, periodic
from pg_scheduler.support.timeutil import human_seconds
from tests.integration.test_cli_ops import _keep_test_logging, cli  # noqa: F401
from tests.support import app_tasks


async def test_retry_of_an_unknown_id_is_one_error(pool, dsn):
    done = await cli(dsn, "retry", "nosuchid")
    assert done.code == 1
    assert done.out == ""
    assert done.err.strip() == "error: no job with id 'nosuchid'"


async def test_sync_client_result_and_wait_for(pool, dsn, make_scheduler):
    await make_scheduler()  # a worker in this process runs the jobs
    with SyncClient(dsn) as client:
        added = await asyncio.to_thread(client.schedule, app_tasks.add, args=(2, 3))
        assert await asyncio.to_thread(client.result, added, 10) == 5
        job = await asyncio.to_thread(client.wait_for, added, timeout=10)
        assert job.status.value == "completed" and job.result == 5
        failing = await asyncio.to_thread(client.schedule, app_tasks.boom)
        with pytest.raises(JobFailed):
            await asyncio.to_thread(client.result, failing, 10)
        later = await asyncio.to_thread(client.schedule, app_tasks.noop, delay=3600)
        with pytest.raises(TimeoutError, match=r"not finished after 0\.2 s"):
            await asyncio.to_thread(client.wait_for, later, 0.2)
        assert await asyncio.to_thread(client.cancel_job, later)
        with pytest.raises(JobCancelled):
            await asyncio.to_thread(client.result, later, 10)
        with pytest.raises(JobNotFound):
            await asyncio.to_thread(client.wait_for, "nosuchid", 1)
        with pytest.raises(ValueError, match="timeout"):
            client.wait_for(added, timeout=-1)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (timedelta(seconds=-5), "-5s"),
        (timedelta(days=-1, hours=-3), "-1d 3h"),
        (-0.5, "-0.5s"),
        (90, "90s"),
        (150, "2m 30s"),
        (7200, "2h"),
    ],
)
def test_durations_read_as_people_write_them(value, shown):
    assert human_seconds(value) == shown


def test_a_negative_interval_is_shown_as_such():
    async def tick() -> None: ...

    with pytest.raises(ValueError, match=r"every= must be positive, got -5s$"):
        periodic(every=timedelta(seconds=-5))(tick)
    with pytest.raises(ValueError, match=r"jitter must be .* got -2s$"):
        periodic(every=timedelta(seconds=5), jitter=-2)(tick)
