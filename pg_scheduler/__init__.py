"""pg_scheduler: a PostgreSQL-native job queue and scheduler for asyncio, on asyncpg."""

from .config import PollingConfig, RetryPolicy, VacuumConfig, VacuumPolicy
from .enums import ConflictResolution, JobPriority, JobStatus, VacuumTrigger
from .job_spec import JobSpec
from .migrate import MigrationError
from .models import Job, TaskInventory
from .periodic import CoalescePolicy, PeriodicJobConfig, periodic
from .scheduler import Scheduler
from .tasks import task

__version__ = "0.3.0"

__all__ = [
    "CoalescePolicy",
    "ConflictResolution",
    "Job",
    "JobPriority",
    "JobSpec",
    "JobStatus",
    "MigrationError",
    "PeriodicJobConfig",
    "PollingConfig",
    "RetryPolicy",
    "Scheduler",
    "TaskInventory",
    "VacuumConfig",
    "VacuumPolicy",
    "VacuumTrigger",
    "periodic",
    "task",
]
