"""Structured logging through structlog. The library never configures it."""

from __future__ import annotations

import logging
from typing import Any

import structlog


class LibraryLogger:
    """structlog's lazy logger, quiet below INFO until the application configures structlog.

    Unconfigured structlog prints every level to stdout; per-job debug events
    (claimed, started) would flood an application that never asked for them.
    Once the application (or the CLI) calls ``structlog.configure``, its
    settings decide everything.
    """

    __slots__ = ("_proxy",)

    def __init__(self, proxy: Any) -> None:
        self._proxy = proxy

    def debug(self, event: str, *args: Any, **fields: Any) -> Any:
        if structlog.is_configured():
            return self._proxy.debug(event, *args, **fields)
        return None

    def is_enabled_for(self, level: int) -> bool:
        if level < logging.INFO and not structlog.is_configured():
            return False
        check = getattr(self._proxy, "is_enabled_for", None)
        return True if check is None else bool(check(level))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._proxy, name)


def get_logger(name: str, **initial: Any) -> Any:
    """A lazy logger for module ``name`` (configuration applied later still takes effect)."""
    return LibraryLogger(structlog.get_logger(name, logger_name=name, **initial))
