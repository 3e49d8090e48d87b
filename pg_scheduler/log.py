"""Structured logging through structlog. The library never configures it."""

from __future__ import annotations

from typing import Any

import structlog


def get_logger(name: str, **initial: Any) -> Any:
    """A lazy structlog logger for module ``name``.

    Lazy, so that configuration the application (or the CLI) applies after
    our modules were imported still takes effect.
    """
    return structlog.get_logger(name, logger_name=name, **initial)
