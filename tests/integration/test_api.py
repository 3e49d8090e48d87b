"""The documented pg-scheduler 0.2.x API: names, parameters, defaults, import paths."""

from __future__ import annotations

import inspect

import pytest

import pg_scheduler
from pg_scheduler import (
    ConflictResolution,
    JobPriority,
    JobSpec,
    PollingConfig,
    Scheduler,
    VacuumConfig,
    VacuumPolicy,
    VacuumTrigger,
    periodic,
)
from pg_scheduler.config import UNSET


def params(func):
    return {name: p.default for name, p in inspect.signature(func).parameters.items()}


def test_public_names():
    for name in [
        "Scheduler",
        "JobPriority",
        "JobSpec",
        "ConflictResolution",
        "PollingConfig",
        "VacuumPolicy",
        "VacuumConfig",
        "VacuumTrigger",
        "periodic",
    ]:
        assert name in pg_scheduler.__all__
        assert getattr(pg_scheduler, name) is not None


def test_legacy_module_paths_still_import():
    from pg_scheduler.conflict_resolution import ConflictResolution as CR
    from pg_scheduler.job_priority import JobPriority as JP
    from pg_scheduler.job_spec import JobSpec as JS
    from pg_scheduler.periodic import periodic as per
    from pg_scheduler.polling import PollingConfig as PC
    from pg_scheduler.scheduler import Scheduler as S
    from pg_scheduler.vacuum import VacuumConfig as VC
    from pg_scheduler.vacuum import VacuumPolicy as VP
    from pg_scheduler.vacuum import VacuumTrigger as VT

    assert (CR, JP, JS, per, PC, S, VC, VP, VT) == (
        ConflictResolution,
        JobPriority,
        JobSpec,
        periodic,
        PollingConfig,
        Scheduler,
        VacuumConfig,
        VacuumPolicy,
        VacuumTrigger,
    )


def test_scheduler_constants_and_defaults():
    assert Scheduler.HEARTBEAT_THRESHOLD == 120
    assert Scheduler.LEASE_DURATION == 60
    assert Scheduler.WORKER_ID_LENGTH == 8
    p = params(Scheduler.__init__)
    assert p["max_concurrent_jobs"] == 25
    assert p["misfire_grace_time"] == 300
    assert p["vacuum_config"] is None
    assert p["vacuum_enabled"] is True
    assert p["batch_claim_limit"] == 10
    assert p["polling_config"] is None
    positional = [
        n
        for n, prm in inspect.signature(Scheduler.__init__).parameters.items()
        if prm.kind is prm.POSITIONAL_OR_KEYWORD
    ]
    assert positional == [
        "self",
        "db_pool",
        "max_concurrent_jobs",
        "misfire_grace_time",
        "vacuum_config",
        "vacuum_enabled",
        "batch_claim_limit",
        "polling_config",
    ]


def test_method_signatures_match_the_documentation():
    s = params(Scheduler.schedule)
    assert s["args"] == () and s["kwargs"] is None
    assert s["priority"] is JobPriority.NORMAL and s["max_retries"] == 0
    assert s["job_id"] is None and s["conflict_resolution"] is ConflictResolution.RAISE
    assert s["misfire_grace_time"] is UNSET
    b = params(Scheduler.schedule_bulk)
    assert b["conflict_resolution"] is ConflictResolution.IGNORE and b["batch_size"] == 1000
    j = params(Scheduler.schedule_job)
    assert list(j)[1:4] == ["job_name", "execution_time", "task_data"]
    assert j["priority"] is JobPriority.NORMAL and j["max_retries"] == 0
    assert j["conflict_resolution"] is ConflictResolution.RAISE and j["misfire_grace_time"] is None
    assert params(Scheduler.get_vacuum_stats)["days"] == 7
    for name in [
        "start",
        "shutdown",
        "initialize_db",
        "recover_orphaned_jobs",
        "periodic_orphan_recovery",
        "schedule",
        "schedule_bulk",
        "listen_for_jobs",
        "execute_job_with_concurrency_control",
        "execute_job",
        "load_task_functions",
        "monitor_heartbeats",
        "send_heartbeat",
        "schedule_job",
        "cancel_job",
        "update_job_status",
        "run_vacuum",
        "get_vacuum_stats",
        "get_total_vacuum_stats",
        "trigger_periodic_job",
    ]:
        assert inspect.iscoroutinefunction(getattr(Scheduler, name)), name
    for name in [
        "get_periodic_jobs",
        "enable_periodic_job",
        "disable_periodic_job",
        "get_periodic_job_status",
    ]:
        method = getattr(Scheduler, name)
        assert callable(method) and not inspect.iscoroutinefunction(method), name


def test_priority_values_and_repr():
    assert [
        p.db_value
        for p in (JobPriority.CRITICAL, JobPriority.HIGH, JobPriority.NORMAL, JobPriority.LOW)
    ] == [1, 3, 5, 8]
    assert repr(JobPriority.NORMAL) == "<JobPriority.NORMAL: normal (db_value=5)>"
    assert JobPriority.from_db_value(3) is JobPriority.HIGH
    assert JobPriority.from_db_value(42) is JobPriority.NORMAL
    assert [c.value for c in ConflictResolution] == ["raise", "ignore", "replace"]


def test_config_defaults_and_positional_construction():
    config = VacuumConfig()
    assert config.completed == VacuumPolicy.after_days(1)
    assert config.failed == VacuumPolicy.after_days(7)
    assert config.cancelled == VacuumPolicy.after_days(3)
    assert config.interval_minutes == 60 and config.track_metrics is False
    assert VacuumPolicy(VacuumTrigger.NEVER) == VacuumPolicy.never()
    assert VacuumPolicy.keep_last(5).keep_count == 5
    assert VacuumPolicy.immediate().trigger is VacuumTrigger.IMMEDIATE
    polling = PollingConfig()
    assert (
        polling.min_interval,
        polling.max_interval,
        polling.backoff_multiplier,
        polling.idle_start_interval,
        polling.semaphore_full_interval,
        polling.jitter,
    ) == (0.05, 2.0, 1.5, 0.5, 1.0, True)


@pytest.mark.parametrize(
    "make",
    [
        lambda: PollingConfig(min_interval=-1),
        lambda: PollingConfig(min_interval=3, max_interval=1),
        lambda: PollingConfig(backoff_multiplier=0.5),
        lambda: VacuumPolicy.after_days(-1),
        lambda: VacuumPolicy.keep_last(-3),
        lambda: VacuumPolicy(VacuumTrigger.TIME_BASED),
        lambda: VacuumConfig(interval_minutes=0),
    ],
)
def test_config_rejects_bad_values(make):
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value)


async def test_scheduler_rejects_bad_configuration(pool):
    with pytest.raises(TypeError, match=r"asyncpg\.Pool"):
        Scheduler("postgres://nope")
    with pytest.raises(ValueError, match="max_concurrent_jobs"):
        Scheduler(pool, max_concurrent_jobs=0)
    with pytest.raises(ValueError, match="batch_claim_limit"):
        Scheduler(pool, batch_claim_limit=0)
    with pytest.raises(ValueError, match="misfire_grace_time"):
        Scheduler(pool, misfire_grace_time=-5)
    with pytest.raises(ValueError, match="job_timeout"):
        Scheduler(pool, job_timeout=0)
    with pytest.raises(TypeError, match="vacuum_config"):
        Scheduler(pool, vacuum_config={"completed": "never"})


async def test_awaitable_periodic_forms_answer_for_unknown_keys(make_scheduler):
    scheduler = await make_scheduler()
    assert await scheduler.fetch_periodic_job_status("no-such-key") is None
    assert await scheduler.set_periodic_job_enabled("no-such-key", True) is False
    assert scheduler.get_periodic_job_status("no-such-key") is None
    assert scheduler.enable_periodic_job("no-such-key") is False
