"""Workflows survive kill -9: worker processes killed at random mid-step while
they run five-step workflows (a transaction, a sleep and a child each). Every
workflow completes; a step's body runs again only when the worker that ran it
before was killed before its checkpoint; each transaction's rows exist once."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support import workflow_crash_tasks
from tests.support.common import ROOT, child_pythonpath, wait_until

pytestmark = pytest.mark.slow


class Worker:
    def __init__(self, proc: asyncio.subprocess.Process, pid: int) -> None:
        self.proc = proc
        self.pid = pid

    @classmethod
    async def start(cls, dsn: str, log: Path) -> Worker:
        env = dict(os.environ)
        env["PG_SCHEDULER_TEST_DB_URL"] = dsn
        env["PYTHONPATH"] = child_pythonpath()
        with log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.support.workflow_worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env=env,
                cwd=str(ROOT),
                start_new_session=True,
            )
        assert proc.stdout is not None
        line = b""
        while not line.startswith(b"ready"):
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line, "the worker exited before it was ready (see its log)"
        return cls(proc, int(line.split()[2]))

    def kill(self) -> None:
        if self.proc.returncode is None:
            os.kill(self.proc.pid, signal.SIGKILL)

    async def close(self) -> None:
        self.kill()
        await self.proc.wait()


async def test_kill_9_mid_step_reruns_only_unrecorded_steps(pool, make_scheduler, dsn, tmp_path):
    await pool.execute(workflow_crash_tasks.DDL)
    producer = await make_scheduler(start=False)  # never started: it only enqueues
    log = tmp_path / "workers.log"
    workers = [await Worker.start(dsn, log) for _ in range(3)]
    killed: set[int] = set()
    rng = random.Random(11)
    count = 200
    try:
        ids = [
            await producer.schedule(
                workflow_crash_tasks.five_steps,
                execution_time=datetime.now(UTC),
                args=(n, 0.25),
            )
            for n in range(count)
        ]

        async def unfinished() -> int:
            return await pool.fetchval(
                "SELECT count(*) FROM scheduled_jobs"
                " WHERE job_id = ANY($1::text[]) AND status <> 'completed'",
                ids,
            )

        # A kill -9 every 1.2-2 s while work is left, each followed by a new worker.
        for _ in range(6):
            await asyncio.sleep(rng.uniform(1.2, 2.0))
            if await unfinished() == 0:
                break
            victim = workers.pop(rng.randrange(len(workers)))
            victim.kill()
            killed.add(victim.pid)
            await victim.proc.wait()
            workers.append(await Worker.start(dsn, log))

        async def done() -> bool:
            return await unfinished() == 0

        try:
            await wait_until(done, timeout=90, interval=0.2, message="every workflow to complete")
        except AssertionError:
            # What was left, and the workers' own words, for the failure report.
            left = await pool.fetch(
                "SELECT status, wait_kind, worker_id, count(*) AS n FROM scheduled_jobs"
                " WHERE job_id = ANY($1::text[]) OR parent_job_id = ANY($1::text[])"
                " GROUP BY 1, 2, 3 ORDER BY 4 DESC",
                ids,
            )
            print("left:", [dict(r) for r in left])
            print("live workers:", [w.pid for w in workers], "killed:", sorted(killed))
            print("workers.log (tail):", log.read_text()[-20000:] if log.exists() else "")
            raise
    finally:
        for worker in workers:
            await worker.close()

    assert killed, "no worker was killed: the workflows finished too soon"
    rows = await pool.fetch(
        "SELECT job_id, status, result::text AS result FROM scheduled_jobs"
        " WHERE job_id = ANY($1::text[])",
        ids,
    )
    assert {r["status"] for r in rows} == {"completed"}
    results = {r["job_id"]: int(r["result"]) for r in rows}
    assert sorted(results.values()) == [2 * n for n in range(count)]

    # Executions per (workflow, step), in order: every one but the last ran on
    # a worker that was killed (before its checkpoint could commit).
    runs: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r in await pool.fetch("SELECT job_id, step, pid FROM wf_crash_runs ORDER BY at"):
        runs[(r["job_id"], r["step"])].append(r["pid"])
    steps = ["s0", "s1", "s2", "s3", "s4", "child"]
    assert {key for key in runs} == {(j, s) for j in ids for s in steps}
    twice = {key: pids for key, pids in runs.items() if len(pids) > 1}
    assert all(set(pids[:-1]) <= killed for pids in twice.values()), twice
    # The transaction's rows: exactly one per workflow.
    tx = await pool.fetch("SELECT job_id, count(*) AS n FROM wf_crash_tx GROUP BY job_id")
    assert {r["job_id"]: r["n"] for r in tx} == dict.fromkeys(ids, 1)
    # The records: every step once, a spawn and its child once.
    records = await pool.fetchval(
        "SELECT count(*) FROM workflow_steps WHERE job_id = ANY($1::text[])", ids
    )
    assert records == count * 9  # s0-s4, tx, sleep, spawn, wait
    children = await pool.fetchval(
        "SELECT count(*) FROM scheduled_jobs WHERE parent_job_id = ANY($1::text[])", ids
    )
    assert children == count
    print(
        f"WF-CRASH kills={len(killed)} reruns={len(twice)} "
        f"executions={sum(len(p) for p in runs.values())}"
    )
