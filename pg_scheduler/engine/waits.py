"""The claim loop's waits: on one event or on the first of two, with a timeout."""

from __future__ import annotations

import asyncio


async def wait_on(event: asyncio.Event, timeout: float) -> None:
    """Until ``event`` is set or ``timeout`` seconds pass (none when <= 0)."""
    if timeout <= 0:
        return
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        pass


async def wait_either(first: asyncio.Event, second: asyncio.Event, timeout: float) -> None:
    """Until either event is set or ``timeout`` seconds pass."""
    if first.is_set() or second.is_set() or timeout <= 0:
        return
    waiters = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
