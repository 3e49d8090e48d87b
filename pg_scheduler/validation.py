"""Argument checks shared by the public API: a clear error at the call."""

from __future__ import annotations

from typing import Any


def check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    """TypeError unless an int (bools are not), ValueError if below ``minimum``."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_seconds(name: str, value: Any, allow_none: bool = True) -> None:
    """ValueError unless a positive number of seconds (or None when allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
