"""Compatibility import path of pg-scheduler 0.2.x."""

from .enums import ConflictResolution

__all__ = ["ConflictResolution"]
