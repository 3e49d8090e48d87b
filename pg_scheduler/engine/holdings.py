"""What the heartbeat asks of a worker: the rows it holds, and reconciling them
with what the database says (lost leases, ghosts). A part of
:class:`~.claimer.Worker`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .executor import LEASE_LOST, RunningJob
from .state import WorkerState


@dataclass(slots=True)
class Holdings:
    """What a worker holds, as the heartbeat needs it before its statement."""

    claims_sent: int
    quiet: bool  # no claim in flight: every claim it can see was answered
    started_ahead: list[str]  # claimed-ahead rows started since the last heartbeat


class HeartbeatView:
    """The worker's side of a heartbeat (see the module docstring)."""

    def __init__(
        self,
        state: WorkerState,
        running: Mapping[str, RunningJob],
        cancel_local: Callable[[str, str], bool],
    ) -> None:
        self.state = state
        self.running = running  # the executor's: jobs whose function runs now
        self._cancel_local = cancel_local

    def holdings(self) -> Holdings:
        """Before a heartbeat: the claim counters, and the claimed-ahead rows that
        started since the last one (taken; give them back with :meth:`unreported`)."""
        state = self.state
        started_ahead, state.started_ahead = state.started_ahead, []
        return Holdings(state.claims_sent, state.claims_in_flight == 0, started_ahead)

    def unreported(self, holdings: Holdings) -> None:
        """The heartbeat failed: report these starts with the next one."""
        self.state.started_ahead[:0] = holdings.started_ahead

    def reconcile(
        self,
        held: Mapping[str, Mapping[str, Any]],
        holdings: Holdings,
        sent_at: float,
        ghost_grace: float,
        lease_lost: Callable[[str], None],
    ) -> list[str]:
        """After a heartbeat: stop jobs whose rows the database no longer has running
        here (``lease_lost`` is told each), and return the rows held there that no
        task here owns (ghosts: a claim whose answer was lost) to hand back."""
        for job_id, running in list(self.running.items()):
            if job_id not in held and running.claimed_at < sent_at:
                if self._cancel_local(job_id, LEASE_LOST):
                    lease_lost(job_id)
        # No claim overlapped the heartbeat: every claim it can see was answered
        # before it was sent, so a row not owned here is a ghost now (after a
        # database restart, say), without waiting for the grace.
        settled = holdings.quiet and self.state.claims_sent == holdings.claims_sent
        owned = self.state.owned
        return [
            job_id
            for job_id, r in held.items()
            if job_id not in owned and (settled or (r["running_for"] or 0) > ghost_grace)
        ]
