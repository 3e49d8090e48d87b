"""Tasks shared by tests and their subprocess workers (``tests.support.app_tasks``)."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import os
from collections import defaultdict
from typing import Any

from pg_scheduler import task

calls: defaultdict[str, list[Any]] = defaultdict(list)
# What a job sees of its caller's context (test_local_start).
request_user: contextvars.ContextVar[str] = contextvars.ContextVar("request_user", default="-")
events: dict[str, asyncio.Event] = {}


def event(name: str) -> asyncio.Event:
    if name not in events:
        events[name] = asyncio.Event()
    return events[name]


@task
async def record(key: str, value: Any = None) -> dict[str, Any]:
    calls[key].append(value)
    event(key).set()
    return {"key": key, "value": value, "pid": os.getpid()}


@task
async def add(a: int, b: int) -> int:
    return a + b


@task
async def noop() -> None:
    return None


@task
async def fail_times(key: str, times: int) -> str:
    calls[key].append("attempt")
    if len(calls[key]) <= times:
        raise RuntimeError(f"planned failure {len(calls[key])}")
    return "ok"


@task
async def sleep_for(key: str, seconds: float) -> str:
    calls[key].append("start")
    event(key + ":started").set()
    try:
        await asyncio.sleep(seconds)
    finally:
        calls[key].append("finally")
    return "slept"


@task
async def boom() -> None:
    raise ValueError("boom from the job")


@task
async def returns_object() -> object:
    return object()


@task
async def wait_for(key: str) -> str:
    """Runs until ``event(key + ':release')`` is set."""
    calls[key].append("start")
    event(key + ":started").set()
    await event(key + ":release").wait()
    return "released"


@task
async def gc_freeze_count() -> int:
    """How many objects the worker's process has frozen out of garbage collection."""
    return gc.get_freeze_count()


@task
async def seen_request_user() -> str:
    """The ``request_user`` context variable as the job sees it."""
    return request_user.get()
