"""Tasks for the debounce and throttle tests (tests/integration/test_debounce_throttle.py):
importable by a producer subprocess as well."""

from __future__ import annotations

from typing import Any

from pg_scheduler import CallArguments, task

#: (task, args, kwargs) of each run in this process, in the order they ran.
runs: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []


@task(name="debounce.reindex")
async def reindex(label: str, n: int = 0) -> str:
    runs.append(("reindex", (label, n), {}))
    return label


def merge_ids(previous: CallArguments, new: CallArguments) -> CallArguments:
    """The burst's ids so far, then the new call's: one job sees them all."""
    ids = [*previous.kwargs.get("ids", []), *new.kwargs.get("ids", [])]
    return CallArguments((), {"ids": ids})


@task(name="debounce.collect", debounce_merge=merge_ids)
async def collect(ids: list[int]) -> int:
    runs.append(("collect", (), {"ids": ids}))
    return len(ids)


def broken_merge(previous: CallArguments, new: CallArguments) -> Any:
    raise RuntimeError("cannot merge")


@task(name="debounce.broken", debounce_merge=broken_merge)
async def broken(n: int) -> int:
    return n


def shapeless_merge(previous: CallArguments, new: CallArguments) -> Any:
    return {"ids": []}


@task(name="debounce.shapeless", debounce_merge=shapeless_merge)
async def shapeless(n: int) -> int:
    return n


@task(
    name="debounce.by_default",
    debounce=0.3,
    dedupe_key=lambda doc, **_: f"doc:{doc}",
)
async def by_default(doc: int, version: int = 0) -> int:
    runs.append(("by_default", (doc, version), {}))
    return version


@task(name="debounce.throttled_by_default", throttle=60, dedupe_key="report")
async def throttled_by_default(n: int = 0) -> int:
    return n


@task(name="debounce.ping")
async def ping(n: int = 0) -> int:
    runs.append(("ping", (n,), {}))
    return n
