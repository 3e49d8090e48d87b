"""A periodic job without an explicit key is routed by a hash
(``periodic:f27ac4c8cbdeb614``, stable across upgrades); wherever it is shown,
its name stands beside it: its runs' log lines, stats() and status, the
worker's task inventory."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from pg_scheduler import periodic
from tests.integration.test_cli_ops import _keep_test_logging, cli  # noqa: F401
from tests.support.common import wait_until

# The package exports the decorator under the module's name.
periodic_module = importlib.import_module("pg_scheduler.periodic.registry")


@pytest.fixture(autouse=True)
def isolated_periodic_registry():
    saved = dict(periodic_module._registry)
    yield
    periodic_module._registry.clear()
    periodic_module._registry.update(saved)


async def nightly_report() -> str:
    return "reported"


async def test_a_hashed_periodic_job_is_shown_by_its_name(pool, dsn, make_scheduler):
    periodic(every=timedelta(seconds=0.2))(nightly_report)
    [(key, config)] = [
        (k, c) for k, c in periodic_module._registry.items() if c.func is nightly_report
    ]
    task = f"periodic:{key}"
    assert len(key) == 16 and config.job_name == "periodic_nightly_report"
    with capture_logs() as logs:
        scheduler = await make_scheduler(run_periodic_jobs=True)

        def ran() -> bool:
            return any(e["event"] == "job completed" and e.get("task") == task for e in logs)

        await wait_until(ran, message="a run of the periodic job")
    completed = next(e for e in logs if e["event"] == "job completed" and e.get("task") == task)
    assert completed["periodic"] == "periodic_nightly_report"
    inventory = await scheduler.load_task_functions()
    assert inventory.periodic[task] == "periodic_nightly_report"
    stats = await scheduler.stats()
    assert task in {t.task_name for t in stats.by_task}  # the stored key is unchanged
    assert stats.label(task) == f"periodic_nightly_report ({task})"
    status = await cli(dsn, "status")
    assert f"periodic_nightly_report ({task})" in status.out
