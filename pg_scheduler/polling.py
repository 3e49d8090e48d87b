"""Compatibility import path of pg-scheduler 0.2.x."""

from .config import PollingConfig

__all__ = ["PollingConfig"]
