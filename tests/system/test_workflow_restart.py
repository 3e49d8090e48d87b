"""Workflows survive PostgreSQL restarts and kill -9 together: 200 workflows
(a step, a transaction, a signal wait, four children gathered, a sleep, a
step) over three worker processes on a private embedded PostgreSQL, restarted
twice (``pg_ctl restart -m fast``) while workers are killed -9 and replaced
and signals are sent from another process. Every workflow completes with its
result; a step body runs again only when the worker that ran it was killed;
each transaction's row exists once. Before runs that lost their connection
mid-transaction or mid-park were handed back, such runs failed the workflow."""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from pg_scheduler import Scheduler
from pg_scheduler.store.migrate import migrate
from pg_scheduler.support.reconnect import is_connection_error
from tests.support import workflow_restart_tasks
from tests.support.fault_worker import restart_postgres
from tests.system.test_workflow_crash import Worker

pytestmark = pytest.mark.slow

COUNT = 200


async def _patiently(call: Any, *args: Any) -> Any:
    """``call(*args)``, retried while the server restarts."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        try:
            return await call(*args)
        except Exception as exc:
            if not is_connection_error(exc) or loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_workflows_complete_across_postgres_restarts_and_kills(tmp_path: Path) -> None:
    pytest.importorskip("pgserver")
    from pg_scheduler.embedded import start

    home = Path(tempfile.mkdtemp(prefix="pgs-wfrestart-"))
    server = await asyncio.to_thread(start, home / "pgdata", cleanup="delete")
    try:
        await _run(server, tmp_path)
    finally:
        await asyncio.to_thread(server.stop)
        shutil.rmtree(home, ignore_errors=True)


async def _run(server: Any, tmp_path: Path) -> None:
    conn = await asyncpg.connect(server.dsn)
    try:
        await migrate(conn)
        await conn.execute(workflow_restart_tasks.DDL)
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(server.dsn, min_size=1, max_size=5)
    log = tmp_path / "workers.log"
    workers = [await Worker.start(server.dsn, log) for _ in range(3)]
    rng = random.Random(7)
    killed: set[int] = set()
    restarts = 0
    try:
        producer = Scheduler(pool)  # never started: it enqueues and signals
        now = datetime.now(UTC)
        ids = [
            await producer.schedule(workflow_restart_tasks.mixed, execution_time=now, args=(n,))
            for n in range(COUNT)
        ]

        async def signals() -> None:
            order = ids[:]
            rng.shuffle(order)
            for job_id in order:
                await asyncio.sleep(rng.uniform(0, 10.0 / COUNT))
                try:
                    await _patiently(producer.signal, job_id, "go", {"v": 1000})
                except ValueError:
                    pass  # it ended already (failed): the check below reports it

        async def faults() -> None:
            nonlocal restarts
            for fault in ("kill", "kill", "restart", "kill", "kill", "restart", "kill"):
                await asyncio.sleep(rng.uniform(1.0, 2.0))
                if fault == "restart":
                    await asyncio.to_thread(restart_postgres, server)
                    restarts += 1
                    continue
                victim = workers.pop(rng.randrange(len(workers)))
                victim.kill()
                killed.add(victim.pid)
                await victim.proc.wait()
                workers.append(await Worker.start(server.dsn, log))

        await asyncio.gather(signals(), faults())

        async def unfinished() -> int:
            return await _patiently(
                pool.fetchval,
                "SELECT count(*) FROM scheduled_jobs"
                " WHERE job_id = ANY($1::text[]) AND status <> 'completed'",
                ids,
            )

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while await unfinished():
            if loop.time() > deadline:
                left = await pool.fetch(
                    "SELECT status, wait_kind, left(error_message, 300) AS error, count(*) AS n"
                    " FROM scheduled_jobs WHERE job_id = ANY($1::text[])"
                    " OR parent_job_id = ANY($1::text[]) GROUP BY 1, 2, 3 ORDER BY 4 DESC",
                    ids,
                )
                print("workers.log (tail):", log.read_text()[-20000:] if log.exists() else "")
                raise AssertionError(f"not every workflow completed: {[dict(r) for r in left]}")
            await asyncio.sleep(0.2)
    finally:
        for worker in workers:
            await worker.close()

    assert restarts == 2 and killed
    rows = await pool.fetch(
        "SELECT result::text AS result FROM scheduled_jobs WHERE job_id = ANY($1::text[])", ids
    )
    assert sorted(int(r["result"]) for r in rows) == [n + 6 + 1000 for n in range(COUNT)]
    runs: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r in await pool.fetch("SELECT job_id, step, pid FROM wf_restart_runs ORDER BY at"):
        runs[(r["job_id"], r["step"])].append(r["pid"])
    steps = ["a", "b", "child0", "child1", "child2", "child3"]
    assert set(runs) == {(j, s) for j in ids for s in steps}
    # A recorded step never runs again: a second run of a body is on a killed worker.
    again = {key: pids for key, pids in runs.items() if len(pids) > 1 and key[1] in ("a", "b")}
    assert all(set(pids[:-1]) <= killed for pids in again.values()), again
    tx = await pool.fetch("SELECT job_id, count(*) AS n FROM wf_restart_tx GROUP BY job_id")
    assert {r["job_id"]: r["n"] for r in tx} == dict.fromkeys(ids, 1)
    handed = await pool.fetchval(
        "SELECT count(*) FROM job_attempts WHERE outcome = 'rescued'"
        " AND error LIKE '%lost under the run%'"
    )
    twice = sum(1 for key, pids in runs.items() if len(pids) > 1)
    await pool.close()
    print(
        f"WF-RESTART kills={len(killed)} restarts={restarts} interrupted_runs={handed}"
        f" bodies_run_twice={twice}"
    )
