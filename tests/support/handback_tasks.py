"""Tasks for tests/system/test_dedupe_handback.py and tests/integration/test_cancelled_schedule.py:
jobs held open by a named gate, and jobs that count their own runs."""

from __future__ import annotations

import asyncio
from collections import Counter

from pg_scheduler import task

#: Per name: set by the test to let ``hold(name)`` finish / set by it when it runs.
gates: dict[str, asyncio.Event] = {}
started: dict[str, asyncio.Event] = {}
#: Runs of each job, counted by the job body: name (hold) or n (count_run).
runs: Counter = Counter()


def reset() -> None:
    gates.clear()
    started.clear()
    runs.clear()


def gate(name: str) -> asyncio.Event:
    return gates.setdefault(name, asyncio.Event())


def began(name: str) -> asyncio.Event:
    return started.setdefault(name, asyncio.Event())


@task(name="handback.hold")
async def hold(name: str) -> str:
    runs[name] += 1
    began(name).set()
    await gate(name).wait()
    return name


@task(name="handback.count_run")
async def count_run(n: int) -> int:
    runs[n] += 1
    return n
