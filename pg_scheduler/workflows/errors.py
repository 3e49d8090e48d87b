"""What a workflow can raise, and the two signals a run gives the executor.

Public: :class:`WorkflowError` and its kinds. :class:`WorkflowMismatch`,
:class:`DuplicateStep` and :class:`WorkflowTimeout` end the job for good
(``failed``, no retry: the same code would meet the same record, or the same
deadline); the executor reads :data:`FINAL_ATTR` on the exception.

Internal: :class:`Parked` (the run parked: its row is already waiting or
pending again, nothing more to write), :class:`LeaseLost` (a write found
that the run no longer holds its job) and :class:`Interrupted` (one of the
run's own statements lost its connection to the database). All three derive
from BaseException, so a workflow's ``except Exception`` cannot swallow
them; the context remembers them anyway, and the run ends with them
whatever the function does after.
"""

from __future__ import annotations

#: An exception class with this attribute true fails its job without a retry.
FINAL_ATTR = "__pg_scheduler_final__"


class WorkflowError(Exception):
    """Base of the errors a workflow raises about itself."""


class WorkflowMismatch(WorkflowError):
    """The workflow's code and its recorded steps disagree: the step reached at
    this place was recorded as another (kind, name or key), or the workflow
    returned before reaching steps it had recorded. The job fails without a
    retry; nothing runs again silently."""

    __pg_scheduler_final__ = True


class DuplicateStep(WorkflowError, ValueError):
    """Two steps of one workflow have the same name and key (give steps in a
    loop a ``key=``). The job fails without a retry."""

    __pg_scheduler_final__ = True


class WorkflowTimeout(WorkflowError, TimeoutError):
    """The workflow ran past its ``timeout``, counted from its first start
    across every park. The job fails without a retry."""

    __pg_scheduler_final__ = True


class StepFailed(WorkflowError):
    """A step raised on its last attempt (its :class:`StepRetry` ran out).
    ``step`` is its name, ``error`` the last attempt's ``Type: message``. The
    failure is recorded: a later run replays it as this same exception unless
    the step is the last one recorded (then a re-run of the workflow, after
    its own retry, runs the step again)."""

    def __init__(self, step: str, key: str, error: str, attempts: int) -> None:
        where = step if not key else f"{step} (key {key!r})"
        super().__init__(f"step {where} failed after {attempts} attempt(s): {error}")
        self.step = step
        self.key = key
        self.error = error
        self.attempts = attempts


class WaitTimeout(WorkflowError, TimeoutError):
    """``wait_for_signal`` timed out (and no ``default`` was given)."""

    def __init__(self, signal: str) -> None:
        super().__init__(f"no signal {signal!r} arrived before the wait's timeout")
        self.signal = signal


class Parked(BaseException):
    """The run parked (sleep, signal, children): its row is waiting, or pending
    to run again; the executor lets the job go without writing anything."""


class LeaseLost(BaseException):
    """A write of this run was refused: the job is no longer this run's (it was
    rescued, cancelled, or its lease expired). The run stops; nothing is written."""


class Interrupted(BaseException):
    """One of the run's own statements (a record, a park, a spawn, a
    ``ctx.transaction()`` block and its commit) lost its connection to the
    database: a restart, a failover, a network fault. The run stops; the
    executor hands the job back as a rescue (counted against max_rescues),
    and the next run replays it from its records. A transaction whose commit
    was cut off is found committed or not by that replay."""
