"""The job state machine: every transition of ``scheduled_jobs.status`` as a table.

Each row names the statement (a constant of the ``store`` package, by module
and name, or ``function:<name>``: a function the migrations define, run by a
trigger) that makes the transition and who calls it. ``tests/unit/test_house.py``
checks that every statement of the store and every migration function that
writes ``status`` is listed here, so a new writer cannot appear without a row.
``None`` as a source: the row is written new (an INSERT).

``waiting`` (migration 0014) is a parked workflow, or (0015) a job whose
dependencies have not all completed: no worker, no lease. It leaves only for
``pending`` (its event came: a signal, its last awaited child's end, its
time, its last dependency's completion) or ``cancelled``. A graph's retry
puts the dependents a failed job's end cancelled back to ``waiting``.
"""

from __future__ import annotations

from typing import NamedTuple

from .enums import FINAL_STATUS_VALUES, JobStatus

PENDING, RUNNING, WAITING = JobStatus.PENDING, JobStatus.RUNNING, JobStatus.WAITING
COMPLETED, FAILED = JobStatus.COMPLETED, JobStatus.FAILED
CANCELLED, EXPIRED = JobStatus.CANCELLED, JobStatus.EXPIRED
FINAL = tuple(JobStatus(value) for value in FINAL_STATUS_VALUES)


class Transition(NamedTuple):
    sources: tuple[JobStatus | None, ...]
    targets: tuple[JobStatus, ...]
    statement: str  # "<store module>.<constant>"
    caller: str


TRANSITIONS: tuple[Transition, ...] = (
    # -- enqueue ---------------------------------------------------------------
    Transition((None,), (PENDING,), "job_sql._INSERT_ONE", "enqueue.Enqueuer (one row)"),
    Transition((None,), (PENDING,), "job_sql._INSERT_FROM_ARRAYS", "enqueue.Enqueuer (many rows)"),
    Transition(
        (PENDING, *FINAL),
        (PENDING,),
        "job_sql._REPLACE_SET",
        "enqueue.Enqueuer (conflict_resolution=REPLACE; never a running row)",
    ),
    Transition(
        (PENDING,),
        (PENDING,),
        "dedupe._REPLACE_PENDING",
        "enqueue/keyed.py (REPLACE on a dedupe key: the pending holder takes the new fields)",
    ),
    Transition(
        (None, PENDING),
        (PENDING,),
        "timing._DEBOUNCE",
        "enqueue/timed.py (debounce: a burst's first call inserts, the others move the "
        "pending holder's due time; never a claimed row)",
    ),
    Transition((None,), (PENDING,), "timing._THROTTLE", "enqueue/timed.py (a period's first call)"),
    Transition(
        (None,),
        (RUNNING, PENDING),
        "job_sql._INSERT_RUNNING",
        "engine/local.py: the in-process start (pending if not due)",
    ),
    # -- claim and complete (the hot path) --------------------------------------
    Transition(
        (PENDING,),
        (RUNNING, EXPIRED),
        "job_sql._CLAIM",
        "engine claim loop, engine/batch.py (a batch task's jobs; expired: past"
        " misfire_grace_time)",
    ),
    Transition(
        (PENDING,),
        (RUNNING, EXPIRED),
        "job_sql._CLAIM_SEEDED",
        "engine claim loop while the group heads are slow to find (engine/heads.py)",
    ),
    Transition(
        (PENDING,),
        (RUNNING, EXPIRED),
        "limits._CLAIM_BESIDE_LIMITS",
        "engine claim loop while global limits exist (the plain claim, cut by due limited work)",
    ),
    Transition(
        (PENDING,),
        (RUNNING, EXPIRED),
        "limits._LIMITED_CLAIM",
        "engine/limited.py: the claim of a limited task or queue",
    ),
    Transition(
        (PENDING,),
        (RUNNING, EXPIRED),
        "key_sql._CLAIM_KEYS",
        "engine/keyed.py: the claim of jobs with a concurrency key",
    ),
    Transition(
        (PENDING,),
        (RUNNING, EXPIRED),
        "fair_sql.FAIR_CLAIM",
        "engine claim loop while keyed rows are pending (engine/fair.py: fair share)",
    ),
    Transition(
        (PENDING,), (RUNNING,), "events._CLAIM_ONE", "pg_scheduler.testing eager run of one job"
    ),
    Transition((RUNNING,), (COMPLETED,), "job_sql._COMPLETE", "engine completer (group commit)"),
    Transition(
        (RUNNING,),
        (COMPLETED,),
        "job_sql._DONE",
        "the completion's UPDATE, the fragment _COMPLETE and _COMPLETE_HANDING share",
    ),
    Transition(
        (RUNNING,),
        (COMPLETED,),
        "job_sql._COMPLETE_HANDING",
        "engine completer, a batch with dependents (engine/hand_off.py: those it takes over "
        "are written running by pg_scheduler_dependencies_handed)",
    ),
    Transition(
        (RUNNING,),
        (COMPLETED,),
        "job_sql._COMPLETE_UNLOCKED",
        "engine completer (a batch not written: its rows apart, never waiting for a row lock)",
    ),
    Transition(
        (RUNNING,),
        (FAILED,),
        "job_sql._FAIL",
        "engine executor and engine/batch_run.py (retries exhausted); services/stall.py"
        " (blocked the loop)",
    ),
    Transition(
        (RUNNING,),
        (PENDING,),
        "job_sql._RETRY",
        "engine executor and engine/batch_run.py (a retry after a delay); services/stall.py",
    ),
    Transition(
        (RUNNING,),
        (PENDING,),
        "job_sql._RELEASE",
        "engine/handback.py (stale buffer, paused queue, shutdown), engine/claimer.py,"
        " engine/batch_run.py (a batch at shutdown)",
    ),
    Transition(
        (RUNNING,),
        (PENDING,),
        "job_sql._RELEASE_GHOSTS",
        "services/heartbeat.py (claims whose answer was lost; only the claim it saw)",
    ),
    Transition(
        (RUNNING,),
        (PENDING,),
        "job_sql._RELEASE_UNOWNED",
        "engine/handback.py (shutdown: every row held here that this process does not own)",
    ),
    Transition(
        (RUNNING,),
        (PENDING,),
        "job_sql._RELEASE_LOCAL_START",
        "engine/local.py (an in-process start whose caller was cancelled mid-insert)",
    ),
    # -- rescue ---------------------------------------------------------------
    Transition(
        (RUNNING,),
        (PENDING, FAILED),
        "workers._RESCUED",
        "the rescue's UPDATE, the fragment _RESCUE and _RESCUE_INTERRUPTED share",
    ),
    Transition(
        (RUNNING,),
        (PENDING, FAILED),
        "workers._RESCUE",
        "services/rescuer.py (dead worker; failed after max_rescues)",
    ),
    Transition(
        (RUNNING,),
        (PENDING, FAILED),
        "workers._RESCUE_INTERRUPTED",
        "engine/executor.py (a workflow run whose own statement lost the database;"
        " failed after max_rescues)",
    ),
    # -- single-job operations ------------------------------------------------------
    Transition(
        (PENDING, RUNNING, WAITING), (CANCELLED,), "job_sql._CANCEL", "Scheduler.cancel_job"
    ),
    Transition(
        (PENDING, RUNNING, WAITING, *FINAL),
        (PENDING, RUNNING, *FINAL),
        "job_sql._SET_STATUS",
        "compat: Scheduler.update_job_status (0.2.x, forces any status)",
    ),
    Transition(
        (FAILED, CANCELLED, EXPIRED),
        (PENDING,),
        "housekeeping._RETRY_JOBS",
        "cli retry (operator)",
    ),
    # -- whole workflows (api/workflow_ops.py) ---------------------------------------
    Transition(
        (PENDING, RUNNING, WAITING),
        (CANCELLED,),
        "graph_sql._CANCEL_MANY",
        "Scheduler.cancel_workflow (every unfinished job of a graph)",
    ),
    Transition(
        (FAILED, CANCELLED, EXPIRED),
        (PENDING, WAITING),
        "graph_sql._REOPEN",
        "Scheduler.retry_workflow (a failed job and the dependents its end cancelled)",
    ),
    Transition((None,), (PENDING,), "graph_sql._FORK_JOB", "Scheduler.fork_workflow"),
    # -- periodic windows -------------------------------------------------------------
    Transition(
        (PENDING,),
        (CANCELLED,),
        "periodic._CANCEL_JOBS",
        "periodic/enqueuer.py (windows a coalesce policy skips)",
    ),
    Transition(
        (PENDING,),
        (CANCELLED,),
        "periodic._CANCEL_PENDING_WINDOWS",
        "periodic/runtime.py (job disabled or rescheduled)",
    ),
    # -- durable workflows (migration 0014) ---------------------------------------------
    Transition(
        (None,),
        (PENDING,),
        "workflow_sql._SPAWN",
        "workflows/children.py: a workflow's children, written with their spawn steps",
    ),
    Transition(
        (RUNNING,),
        (WAITING, PENDING),
        "workflow_sql._PARK_SLEEP",
        "workflows/parking.py: ctx.sleep (pending, due then, when that is within the "
        "timer's lookahead)",
    ),
    Transition(
        (RUNNING,),
        (WAITING, PENDING),
        "workflow_sql._PARK",
        "workflows/parking.py, children.py: a wait for a signal or for children, nothing "
        "there yet (the row locked first; pending when a timeout or deadline is near)",
    ),
    Transition(
        (WAITING, PENDING),
        (PENDING,),
        "signal_sql._SIGNAL",
        "Scheduler.signal: the workflow waits for this signal (due now)",
    ),
    Transition(
        (WAITING, PENDING),
        (PENDING,),
        "signal_sql._SIGNAL_MANY",
        "Scheduler.signal_bulk: each workflow waiting for one of these signals (due now)",
    ),
    Transition(
        (WAITING,),
        (PENDING,),
        "workflow_sql._WAKE_DUE",
        "services/workflow_timer.py: a sleep's end, a signal wait's timeout, a deadline",
    ),
    Transition(
        (WAITING, PENDING),
        (PENDING,),
        "function:pg_scheduler_workflow_children_ended",
        "a completion statement or trigger (0021): the last child a parked workflow waits for"
        " ended (due now)",
    ),
    Transition(
        (PENDING, RUNNING, WAITING),
        (CANCELLED,),
        "function:pg_scheduler_workflow_cancel_children",
        "trigger (0014): a workflow ended (or was replaced); its children not spawned detached",
    ),
    # -- declared dependencies (migration 0015) -------------------------------------------
    Transition(
        (None,),
        (WAITING, PENDING),
        "dependencies._INSERT_DEPENDENTS",
        "enqueue/dependencies.py: a job with depends_on, waiting (pending when every "
        "dependency had completed); a large graph by COPY of the same columns",
    ),
    Transition(
        (WAITING,),
        (PENDING, CANCELLED),
        "function:pg_scheduler_dependency_ended",
        "trigger (0015): a dependency ended; the last one met makes its dependent pending, "
        "one that did not complete cancels the dependents whose policy is cancel",
    ),
    Transition(
        (WAITING,),
        (PENDING,),
        "function:pg_scheduler_dependencies_completed",
        "job_sql._COMPLETE, _COMPLETE_UNLOCKED, _SET_STATUS (0015): the running jobs a "
        "statement completes release their dependents, one call per statement",
    ),
    Transition(
        (WAITING,),
        (PENDING, RUNNING),
        "function:pg_scheduler_dependencies_handed",
        "job_sql._COMPLETE_HANDING (0023): as above, and the dependents the completing "
        "worker may run are written running for it (engine/hand_off.py)",
    ),
)

# Deleting a completed row in the completion itself (``jobs._COMPLETE_AND_DELETE``,
# the IMMEDIATE vacuum policy) and the vacuum's deletes end a row, not a status.
