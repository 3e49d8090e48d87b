"""A workflow decorated in another thread (no event loop there) while a
Scheduler runs: the registration hands the timer's start to the scheduler's
loop instead of failing."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pg_scheduler import workflow
from tests.support.common import wait_until


async def test_a_workflow_registered_from_a_thread_starts_the_timer_on_the_loop(
    make_scheduler: Any,
) -> None:
    scheduler = await make_scheduler()
    timer = scheduler._lifecycle.workflow_timer
    # Workflows of other tests may have started it: as if none had.
    await timer.stop()
    assert not timer.running
    errors: list[BaseException] = []

    def register() -> None:
        try:

            @workflow(name="thread_registered.flow")
            async def flow(ctx: Any) -> int:
                return 1

        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=register)
    thread.start()
    await asyncio.to_thread(thread.join)
    assert errors == []
    await wait_until(lambda: timer.running, timeout=5)
