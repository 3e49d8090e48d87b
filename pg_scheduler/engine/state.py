"""What the parts of one :class:`~.claimer.Worker` share: the rows it holds, the
tasks it runs, the claims it sent, the queues it heard paused, and whether it
still claims. One small object, handed to each part that needs it; no part
reads another part's attributes."""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False, slots=True)
class WorkerState:
    """The worker's shared state (see the module docstring)."""

    #: Claimed here and not yet settled (queued, running, or awaiting its write).
    owned: set[str] = field(default_factory=set)
    #: Each started job's task.
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    #: Hand-backs running in the background (shutdown waits for them).
    tasks_background: set[asyncio.Task[Any]] = field(default_factory=set)
    #: Rows the claim marked claimed ahead that have started since the last
    #: heartbeat, which tells the database (see store._HEARTBEAT).
    started_ahead: list[str] = field(default_factory=list)
    #: Queues paused (as heard on the control channel) -> claims sent by then:
    #: their claimed-ahead rows, and rows of claims already in flight, are
    #: handed back instead of started. A later claim that returns rows of such
    #: a queue proves it resumed (claims skip paused queues).
    paused_queues: dict[str, int] = field(default_factory=dict)
    #: Claims sent and not answered yet, and claims ever sent: the heartbeat
    #: tells a claim whose answer was lost from one still in flight by them.
    claims_in_flight: int = 0
    claims_sent: int = 0
    #: False once shutdown began: nothing new is claimed or started.
    claiming: bool = True
    #: The context every job's task copies (Scheduler.start() sets it to its
    #: own); None: the context of whoever starts the job.
    job_context: contextvars.Context | None = None
