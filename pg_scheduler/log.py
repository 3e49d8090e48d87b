"""Structured logging through structlog. The library never configures it."""

from __future__ import annotations

from typing import Any

import structlog


def get_logger(name: str, **initial: Any) -> Any:
    """A structlog logger bound to the module name (and any initial fields)."""
    return structlog.get_logger(name).bind(**initial)
