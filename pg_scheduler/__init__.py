"""pg_scheduler: a PostgreSQL-native job queue and scheduler for asyncio, on asyncpg."""

from .api.results import JobCancelled, JobExpired, JobFailed, JobNotFound
from .batching import BatchItem
from .config import PollingConfig, RetryPolicy, VacuumConfig, VacuumPolicy
from .context import JobContext, current_job
from .enqueue.queue_keys import queue_keys
from .enqueue.timing import CallArguments
from .enums import ConflictResolution, JobPriority, JobStatus, VacuumTrigger
from .job_spec import JobSpec
from .limits import RateLimit
from .models import Attempt, Job, TaskInventory
from .notify.events import Event, Subscription
from .periodic import CoalescePolicy, PeriodicJobConfig, periodic
from .scheduler import Scheduler
from .store.migrate import MigrationError
from .sync_client import SyncClient
from .tasks import task
from .workflows import (
    StepFailed,
    StepRetry,
    WaitTimeout,
    WorkflowContext,
    WorkflowError,
    WorkflowMismatch,
    WorkflowTimeout,
    workflow,
)
from .workflows.graph import Flow, chain, chord, group

__version__ = "0.3.0"

__all__ = [
    "Attempt",
    "BatchItem",
    "CallArguments",
    "CoalescePolicy",
    "ConflictResolution",
    "Event",
    "Flow",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobExpired",
    "JobFailed",
    "JobNotFound",
    "JobPriority",
    "JobSpec",
    "JobStatus",
    "MigrationError",
    "PeriodicJobConfig",
    "PollingConfig",
    "RateLimit",
    "RetryPolicy",
    "Scheduler",
    "StepFailed",
    "StepRetry",
    "Subscription",
    "SyncClient",
    "TaskInventory",
    "VacuumConfig",
    "VacuumPolicy",
    "VacuumTrigger",
    "WaitTimeout",
    "WorkflowContext",
    "WorkflowError",
    "WorkflowMismatch",
    "WorkflowTimeout",
    "chain",
    "chord",
    "current_job",
    "group",
    "periodic",
    "queue_keys",
    "task",
    "workflow",
]
