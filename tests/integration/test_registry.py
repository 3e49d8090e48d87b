"""Routing by task name: collisions, late registration, jobs nobody can run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pg_scheduler
from pg_scheduler.tasks import TaskRegistry, task_name_of
from tests.support import key_tasks, mail_tasks, sms_tasks
from tests.support.common import job_status, wait_for_status, wait_until


def now() -> datetime:
    return datetime.now(UTC) - timedelta(milliseconds=1)


async def test_same_function_name_in_two_modules_never_collides(pool, make_scheduler):
    scheduler = await make_scheduler(tasks=TaskRegistry())
    mail = await scheduler.schedule(mail_tasks.send, execution_time=now(), args=("ada",))
    sms = await scheduler.schedule(sms_tasks.send, execution_time=now(), args=("ada",))
    await wait_for_status(pool, mail, "completed")
    await wait_for_status(pool, sms, "completed")
    assert (await scheduler.get_job(mail)).result == "mail to ada"
    assert (await scheduler.get_job(sms)).result == "sms to ada"
    names = dict(await pool.fetch("SELECT job_id, task_name FROM scheduled_jobs"))
    assert names == {mail: "tests.support.mail_tasks:send", sms: "tests.support.sms_tasks:send"}
    # job_name keeps its 0.2.x meaning.
    assert {r["job_name"] for r in await pool.fetch("SELECT job_name FROM scheduled_jobs")} == {
        "send"
    }


async def test_a_scheduler_given_an_empty_registry_runs_only_its_own_tasks(make_scheduler):
    own = TaskRegistry()
    scheduler = await make_scheduler(start=False, tasks=own)
    # A task decorated with @task in this process is the default registry's,
    # not this scheduler's.
    assert key_tasks.step.__name__ == "step"
    assert "keys.step" in pg_scheduler.tasks.default_registry.names()
    assert scheduler.registry.names() == []
    scheduler.register_task(mail_tasks.send)
    assert task_name_of(mail_tasks.send) in scheduler.registry.names()
    assert len(own) == 0  # registering on the scheduler leaves the given one alone


async def test_job_nobody_can_run_waits_visibly_until_someone_registers(pool, make_scheduler):
    producer = await make_scheduler(start=False, tasks=TaskRegistry())
    worker = await make_scheduler(tasks=TaskRegistry())
    job_id = await producer.schedule(mail_tasks.send, execution_time=now(), args=("grace",))

    async def reported():
        inventory = await worker.load_task_functions()
        return inventory.unknown.get("tests.support.mail_tasks:send") == 1

    await wait_until(reported)
    assert await job_status(pool, job_id) == "pending"  # never failed by a process lacking code
    worker.register_task(mail_tasks.send)  # late registration wakes the claim loop
    await wait_for_status(pool, job_id, "completed", timeout=3)


async def test_explicit_task_name_and_decorator_forms(pool, make_scheduler):
    registry = TaskRegistry()
    scheduler = await make_scheduler(tasks=registry)

    @scheduler.task(name="billing.charge")
    async def charge(amount: int) -> int:
        return amount * 2

    assert task_name_of(charge) == "billing.charge"
    job_id = await scheduler.schedule(charge, execution_time=now(), args=(21,))
    await wait_for_status(pool, job_id, "completed")
    assert (await scheduler.get_job(job_id)).result == 42

    @pg_scheduler.task
    async def module_level() -> str:
        return "ok"

    assert (
        "tests.integration.test_registry:test_explicit_task_name_and_decorator_forms.<locals>.module_level"
        in (pg_scheduler.tasks.default_registry)
    )


def test_registering_a_sync_function_fails():
    import pytest

    def not_async():
        return 1

    with pytest.raises(TypeError, match="async function"):
        pg_scheduler.task(not_async)
    with pytest.raises(ValueError, match="non-empty"):
        TaskRegistry().register(mail_tasks.send, name="")
