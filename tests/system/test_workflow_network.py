"""A workflow's transaction when the path to PostgreSQL goes half-open: its
record is sent into a black hole (``tests/support/tcp_proxy.py``: bytes
dropped, nothing closed, the old connections dead for good after the heal).
The transaction's own statements are bounded by ``statement_timeout``: the
run is interrupted instead of waiting for ever on the dead connection, the
job is handed back once the path heals, and the next run commits the block
once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from pg_scheduler import Job, JobStatus, WorkflowContext, workflow
from pg_scheduler.workflows import run as workflow_run
from tests.support.common import wait_until
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

STATEMENT_TIMEOUT = 1.0
OUTAGE = 2.0

ran: Counter[str] = Counter()
#: The first run's block waits here, the path still open, until the test
#: black-holes it: then its record goes into the hole.
gates: dict[str, asyncio.Event] = {}


@workflow(name="net.transaction")
async def net_transaction(ctx: WorkflowContext) -> str:
    async with ctx.transaction("tx") as conn:
        ran["block"] += 1
        await conn.execute("INSERT INTO wf_net_effects VALUES ($1)", ctx.job_id)
        if ran["block"] == 1:
            gates["at_end"].set()
            await gates["go"].wait()
    return "done"


async def _gated(what: str) -> str:
    ran[what] += 1
    if ran[what] == 1:
        gates["at_end"].set()
        await gates["go"].wait()
    return what


@workflow(name="net.step")
async def net_step(ctx: WorkflowContext) -> str:
    return await ctx.step("gated", _gated, "gated")


async def _through_an_outage(
    pool: asyncpg.Pool,
    dsn: str,
    proxy: TcpProxy,
    make_scheduler: Any,
    func: Any,
    statement_timeout: float,
) -> tuple[Job, float]:
    """Run ``func`` on a scheduler whose pool goes through ``proxy``; once its
    first run waits at the gate, black-hole the path, open the gate, heal
    after OUTAGE. The job once completed, and the seconds from the heal."""
    ran.clear()
    gates.clear()
    gates["at_end"], gates["go"] = asyncio.Event(), asyncio.Event()
    through = await asyncpg.create_pool(proxy.dsn_for(dsn), min_size=1, max_size=10)
    scheduler = None
    try:
        scheduler = await make_scheduler(
            db_pool=through,
            statement_timeout=statement_timeout,
            # Longer than the outage: the live worker's jobs are not rescued.
            lease_duration=30.0,
            heartbeat_threshold=30.0,
        )
        job_id = await scheduler.schedule(func, execution_time=datetime.now(UTC))
        await asyncio.wait_for(gates["at_end"].wait(), 15)
        proxy.black_hole()
        gates["go"].set()  # what the first run writes next goes into the hole
        await asyncio.sleep(OUTAGE)
        proxy.heal()
        healed = time.monotonic()

        async def completed() -> bool:
            status = await pool.fetchval(
                "SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id
            )
            return status == "completed"

        await wait_until(completed, timeout=20, message="the workflow completed after the heal")
        after = time.monotonic() - healed
        job = await scheduler.get_job(job_id)
        assert job is not None
        return job, after
    finally:
        gates.setdefault("go", asyncio.Event()).set()
        if scheduler is not None:
            await scheduler.shutdown(grace_period=1.0)
        try:
            # Connections black-holed before the heal stay dead: close, bounded.
            await asyncio.wait_for(through.close(), 10)
        except TimeoutError:
            through.terminate()


async def test_a_transaction_cut_off_by_a_half_open_path_is_handed_back(
    pool: asyncpg.Pool, dsn: str, proxy: TcpProxy, make_scheduler
) -> None:
    await pool.execute("CREATE TABLE IF NOT EXISTS wf_net_effects (job_id text)")
    job, after = await _through_an_outage(
        pool, dsn, proxy, make_scheduler, net_transaction, STATEMENT_TIMEOUT
    )
    print(f"WF-NET completed {after:.2f} s after the heal")
    assert job.status is JobStatus.COMPLETED
    assert ran["block"] == 2  # the first block's commit never happened
    effects = await pool.fetchval(
        "SELECT count(*) FROM wf_net_effects WHERE job_id = $1", job.job_id
    )
    assert effects == 1
    rescues = await pool.fetchval(
        "SELECT rescue_count FROM scheduled_jobs WHERE job_id = $1", job.job_id
    )
    assert rescues == 1


async def test_a_record_unwritable_past_its_patience_hands_the_run_back(
    pool: asyncpg.Pool,
    dsn: str,
    proxy: TcpProxy,
    make_scheduler,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step's record retried while the path is down, past the run's write
    patience (1 s here, 30 s by default): the run is interrupted, not failed;
    the job is handed back once the path heals, and the step runs again (its
    record was never written: at least once)."""
    monkeypatch.setattr(workflow_run, "WRITE_PATIENCE", 1.0)
    job, _ = await _through_an_outage(pool, dsn, proxy, make_scheduler, net_step, 0.5)
    assert ran["gated"] == 2
    row = await pool.fetchrow(
        "SELECT rescue_count, result::text AS result FROM scheduled_jobs WHERE job_id = $1",
        job.job_id,
    )
    assert row["rescue_count"] == 1 and row["result"] == '"gated"'
