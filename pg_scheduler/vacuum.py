"""Compatibility import path of pg-scheduler 0.2.x."""

from .config import VacuumConfig, VacuumPolicy
from .enums import VacuumTrigger

__all__ = ["VacuumConfig", "VacuumPolicy", "VacuumTrigger"]
