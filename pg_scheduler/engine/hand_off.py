"""Dependents taken over by the completion that releases them.

When a job that others depend on completes, the completion statement
(``store.complete_handing``, migration 0023) writes the dependents it
releases running for this worker, if this worker's plain claim would take
them (task, queue, no limit or key, due, at least as urgent as the due work
it serves), and returns them: they start here without a NOTIFY, a claim, or
waiting behind other claims. A chain's next job starts in the slot its
predecessor leaves.

Room: a batch of ``n`` completions takes over at most ``n`` dependents, so
the rows this worker holds never grow by it (the completed rows are let go
as the dependents are taken), and no more than the slots free when the
write is sent, all started at once (as a claim's, a row whose slot the
claim loop took meanwhile waits in the buffer). A busy worker (no free slot)
takes nothing over: the released dependents are pending, and its claim
loop (or another worker) claims them beside the next completion write, in
their turn with other due work. While the write is in flight it counts as a
claim in flight: rows written for this worker whose answer was lost are
ghosts the heartbeat hands back. A worker that stopped claiming takes over
nothing; rows that come back after it stopped are handed back at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..store import HandOffRoom
from ..support.log import get_logger
from .slots import Slots
from .state import WorkerState

log = get_logger("pg_scheduler.worker")


class HandOff:
    """Room for a completion batch's dependents, and their dispatch."""

    def __init__(
        self,
        *,
        state: WorkerState,
        slots: Slots,
        names: Callable[[], list[str]],
        lease_seconds: Callable[[], float],
        dispatch: Callable[[list[Any], int], None],
        release: Callable[[list[str]], Awaitable[list[str]]],
    ) -> None:
        self.state = state
        self.slots = slots
        self._names = names
        self._lease_seconds = lease_seconds
        self._dispatch = dispatch
        self._release = release

    def offer(self, completions: int) -> tuple[HandOffRoom, int] | None:
        """Room for the dependents a batch of ``completions`` may take over, and
        the claim's number (counted in flight until :meth:`taken`); None: none."""
        state = self.state
        slots = self.slots
        # Only into free slots: with none, the claim loop takes the released
        # dependents beside this write (more of the two at once). Per-queue
        # limits are counted per row as it is held: not taken over.
        most = min(completions, slots.start_now())
        if most <= 0 or not state.claiming or slots.queue_limits is not None:
            return None
        names = self._names()
        if not names:
            return None
        room = HandOffRoom(
            tasks=names,
            queues=slots.served,
            most=most,
            start_now=most,
            lease_seconds=self._lease_seconds(),
        )
        state.claims_in_flight += 1
        state.claims_sent += 1
        return room, state.claims_sent

    async def taken(self, claim: int, rows: Sequence[Any]) -> None:
        """The write of claim ``claim`` answered with ``rows`` (or failed: none)."""
        state = self.state
        state.claims_in_flight -= 1
        if not rows:
            return
        if state.claiming:
            self._dispatch(list(rows), claim)
            return
        # Stopped meanwhile: nothing new starts; give them back as never started.
        ids = [r["job_id"] for r in rows]
        try:
            await self._release(ids)
        except Exception as exc:
            log.warning(
                "could not hand back dependents taken over at shutdown; the rescuer will",
                job_ids=ids,
                error=repr(exc),
            )
