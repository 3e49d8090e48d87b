"""The engine of one Scheduler: claim due jobs, run them, complete them.

``claimer``: the claim loop, the claimed-ahead buffer, each job's task
(:class:`Worker`). ``slots``: capacity, the one owner of how many may run and
how many rows are held. ``executor``: one claimed job and what happened to it.
``completer``: group commit of completions, failed attempts. ``held``: the
pooled connection a serial hot path keeps. ``local``: the in-process start.
"""

from .claimer import Worker
from .completer import Completer, write_failure
from .executor import (
    BLOCKED_LOOP,
    CANCELLED_REMOTELY,
    LEASE_LOST,
    SHUTDOWN,
    ClaimedJob,
    Executor,
    RunningJob,
)
from .held import HeldConnection
from .holdings import Holdings
from .slots import Slots

__all__ = [
    "BLOCKED_LOOP",
    "CANCELLED_REMOTELY",
    "LEASE_LOST",
    "SHUTDOWN",
    "ClaimedJob",
    "Completer",
    "Executor",
    "HeldConnection",
    "Holdings",
    "RunningJob",
    "Slots",
    "Worker",
    "write_failure",
]
