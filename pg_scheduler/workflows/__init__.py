"""Durable workflows: jobs whose steps survive a crash, that sleep, wait for
signals and for child jobs while holding no slot (docs: Durable workflows).

``decorator``: ``@workflow``. ``context``: what a workflow receives.
``replay``: records and their matching; ``run``: one run's state and its
writes; ``steps``, ``transactions``, ``parking``, ``children``: the calls;
``runner``: a run for the executor; ``errors``: what they raise. The SQL is
in ``pg_scheduler/store/workflows.py``.
"""

from .children import ChildHandle
from .context import WorkflowContext
from .decorator import WORKFLOW, is_workflow, workflow
from .errors import (
    DuplicateStep,
    StepFailed,
    WaitTimeout,
    WorkflowError,
    WorkflowMismatch,
    WorkflowTimeout,
)
from .steps import StepRetry

__all__ = [
    "WORKFLOW",
    "ChildHandle",
    "DuplicateStep",
    "StepFailed",
    "StepRetry",
    "WaitTimeout",
    "WorkflowContext",
    "WorkflowError",
    "WorkflowMismatch",
    "WorkflowTimeout",
    "is_workflow",
    "workflow",
]
