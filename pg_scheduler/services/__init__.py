"""Background loops the Scheduler starts and stops; none reaches into another."""

from .base import Service
from .heartbeat import HeartbeatService
from .rescuer import RescuerService
from .table_vacuum import TableVacuumService
from .vacuum import VacuumService
from .workflow_timer import WorkflowTimerService

__all__ = [
    "HeartbeatService",
    "RescuerService",
    "Service",
    "TableVacuumService",
    "VacuumService",
    "WorkflowTimerService",
]
