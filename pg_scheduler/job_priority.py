"""Compatibility import path of pg-scheduler 0.2.x."""

from .enums import JobPriority

__all__ = ["JobPriority"]
