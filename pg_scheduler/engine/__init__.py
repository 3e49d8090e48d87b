"""The engine of one Scheduler: claim due jobs, run them, complete them.

``claimer``: the claim loop and dispatch (:class:`Worker`, which holds the
parts below); ``state``: what the worker's parts share; ``starts``: each job's
task (accept, start, free its slot, settle it after the write); ``handback``:
giving claimed rows back; ``holdings``: what the heartbeat asks; ``channels``:
the worker's side of the listener's channels.
``slots``: capacity, the one owner of how many may run and how many rows are
held. ``executor``: running one claimed job; ``job``: its records;
``outcome``: what happened to it. ``completer``: group commit of completions,
each settled once after its write. ``held``: the pooled connection a serial
hot path keeps. ``local``: the in-process start. ``limited``: the claim of
jobs a global limit binds.
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
