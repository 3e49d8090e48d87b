"""Named queues on the Scheduler: which queues a worker serves (``queues=``,
checked here), and the operator's pause, resume and listing (:class:`Queues`, a
part of :class:`~pg_scheduler.Scheduler`; a worker's side of a pause is
``engine/channels.py``). The SQL is in ``store/queues.py``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..store import QueueStore
from ..support.validation import check_queue


def check_queues(
    queues: Any, max_concurrent_jobs: int
) -> tuple[list[str] | None, dict[str, int] | None]:
    """``Scheduler(queues=...)``: None (every queue), a list of names, or a
    mapping name -> local concurrency (positive ints whose sum is at most
    ``max_concurrent_jobs``). Returns (served queues or None, limits or None)."""
    if queues is None:
        return None, None
    if isinstance(queues, str):
        raise TypeError("queues must be a list of queue names or a mapping, not a str")
    if isinstance(queues, Mapping):
        if not queues:
            raise ValueError("queues must name at least one queue")
        limits: dict[str, int] = {}
        for name, limit in queues.items():
            check_queue(name, "queues key")
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise TypeError(f"queues[{name!r}] must be an int, got {limit!r}")
            if limit < 1:
                raise ValueError(f"queues[{name!r}] must be >= 1, got {limit}")
            limits[name] = limit
        total = sum(limits.values())
        if total > max_concurrent_jobs:
            raise ValueError(
                f"queues' concurrencies add up to {total}, more than "
                f"max_concurrent_jobs={max_concurrent_jobs}"
            )
        return list(limits), limits
    try:
        names = list(queues)
    except TypeError:
        raise TypeError(
            f"queues must be None, a list of queue names or a mapping, got {queues!r}"
        ) from None
    if not names:
        raise ValueError("queues must name at least one queue")
    for name in names:
        check_queue(name, "queues entry")
    return list(dict.fromkeys(names)), None


def parse_queues_option(text: str) -> list[str] | dict[str, int]:
    """The CLI's ``--queues emails=20,reports=2`` (a mapping) or ``emails,reports``
    (a list); ValueError on anything else."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError("--queues needs at least one queue name")
    if not any("=" in item for item in items):
        return [check_queue(item, "--queues name") for item in items]
    limits: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--queues: give every queue a concurrency or none, got {item!r}")
        try:
            limits[check_queue(name.strip(), "--queues name")] = int(value)
        except ValueError as exc:
            raise ValueError(f"--queues: {item!r}: {exc}") from None
    return limits


class Queues:
    """Pause, resume and list queues (stored in ``scheduler_queues``)."""

    def __init__(self, store: QueueStore) -> None:
        self.store = store

    async def pause_queue(self, name: str) -> None:
        """Stop every worker claiming from ``name`` (the claim skips paused queues)."""
        await self.store.set_paused(check_queue(name), True)

    async def resume_queue(self, name: str) -> None:
        """Let every worker claim from ``name`` again (they are woken)."""
        await self.store.set_paused(check_queue(name), False)

    async def list_queues(self) -> list[dict[str, Any]]:
        """Every known queue, with its counts."""
        return [dict(r) for r in await self.store.queues()]
