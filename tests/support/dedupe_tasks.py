"""Tasks for the dedupe-key tests (tests/integration/test_dedupe.py): importable by a
producer subprocess as well."""

from __future__ import annotations

import asyncio

from pg_scheduler import task

#: Set by a test to let ``gated`` finish; ``gated_started`` is set when it runs.
gate = asyncio.Event()
gated_started = asyncio.Event()
#: Each run of ``gated``; its first run fails.
gated_runs: list[int] = []


@task(name="dedupe.sync", dedupe_key=lambda customer_id, **_: f"sync:{customer_id}")
async def sync_customer(customer_id: int, full: bool = False) -> int:
    return customer_id


@task(name="dedupe.sync_pending", dedupe_key="sync-one", dedupe_scope="pending")
async def sync_pending(n: int) -> int:
    return n


@task(name="dedupe.bad_key", dedupe_key=lambda n: 1 / n and f"k{n}")
async def bad_key(n: int) -> int:
    return n


@task(name="dedupe.int_key", dedupe_key=lambda n: n)  # type: ignore[arg-type, return-value]
async def int_key(n: int) -> int:
    return n


@task(name="dedupe.noop")
async def noop(n: int = 0) -> int:
    return n


@task(name="dedupe.gated")
async def gated(n: int) -> int:
    gated_runs.append(n)
    gated_started.set()
    await gate.wait()
    if len(gated_runs) == 1:
        raise RuntimeError("first attempt fails")
    return n
