"""Structured logging through structlog. The library never configures it."""

from __future__ import annotations

from typing import Any

import structlog


def get_logger(name: str, **initial: Any) -> Any:
    """A structlog logger bound to the module name (and any initial fields).

    It stays a lazy proxy: modules create their loggers at import time, and
    an eager ``bind()`` would freeze structlog's configuration of that moment,
    ignoring the one the application (or the CLI) sets up afterwards.
    """
    return structlog.get_logger(name, **initial)
