"""Compatibility import path of pg-scheduler 0.2.x."""

from .config import JobSpec

__all__ = ["JobSpec"]
