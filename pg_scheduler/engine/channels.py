"""The worker's side of the listener's channels: a job enqueued into a queue it
serves wakes it, a cancel stops the job running here, a pause hands back the
queue's claimed-ahead rows (a resume wakes it), and a reconnect makes it look
at once for what it missed. A part of the Scheduler; the LISTEN connection
itself is ``notify/listener.py``."""

from __future__ import annotations

from collections.abc import Callable

from ..enums import DEFAULT_QUEUE
from ..store import CANCEL_CHANNEL, JOBS_CHANNEL, QUEUES_CHANNEL, Qualifier
from ..support.log import get_logger
from .claimer import Worker
from .executor import CANCELLED_REMOTELY

# The lines logged here keep the Scheduler's logger name.
log = get_logger("pg_scheduler.scheduler")


class WorkerChannels:
    """Notification handlers for one worker (see the module docstring)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def handlers(self, qualify: Qualifier) -> dict[str, Callable[[str], None]]:
        """Channel (namespaced by schema) -> its handler, for the listener."""
        return {
            qualify.channel(JOBS_CHANNEL): self.on_jobs,
            qualify.channel(CANCEL_CHANNEL): self.on_cancel,
            qualify.channel(QUEUES_CHANNEL): self.on_queues,
        }

    def on_jobs(self, payload: str) -> None:
        """New rows: the payload names their queue ('' for "default", as 0.2.x
        sent); '*' (hand-backs, rescues, retries) concerns every queue;
        '!events': a subscriber changed the event flags (engine.claim_events)."""
        worker = self.worker
        if payload == "!events":
            worker.claim_events.flags_changed()
            return
        served = worker.slots.served
        if served is None or payload == "*" or (payload or DEFAULT_QUEUE) in served:
            worker.wake()

    def on_cancel(self, job_id: str) -> None:
        """``cancel_job`` in any process: stop the job if it runs here."""
        if self.worker.cancel_local(job_id, CANCELLED_REMOTELY):
            log.info("cancelling running job", job_id=job_id, worker_id=self.worker.worker_id)

    def on_queues(self, payload: str) -> None:
        """A pause or resume (payload "pause NAME" or "resume NAME"), from any process."""
        action, _, queue = payload.partition(" ")
        self.worker.handback.queue_paused(queue, action == "pause")

    def on_reconnect(self) -> None:
        """Notifications sent while the listener was disconnected are lost: look now."""
        self.worker.wake()
