"""Structured logging through structlog. The library never configures it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Iterable
from typing import Any, TypeVar

import structlog


class LibraryLogger:
    """structlog's lazy logger, quiet below WARNING until the application configures structlog.

    Unconfigured structlog prints every level to stdout; per-job events
    (claimed, started, completed) would flood an application that never asked
    for them. Once the application (or the CLI) calls ``structlog.configure``,
    its settings decide everything.
    """

    __slots__ = ("_proxy",)

    def __init__(self, proxy: Any) -> None:
        self._proxy = proxy

    def debug(self, event: str, *args: Any, **fields: Any) -> Any:
        if structlog.is_configured():
            return self._proxy.debug(event, *args, **fields)
        return None

    def info(self, event: str, *args: Any, **fields: Any) -> Any:
        if structlog.is_configured():
            return self._proxy.info(event, *args, **fields)
        return None

    def is_enabled_for(self, level: int) -> bool:
        if level < logging.WARNING and not structlog.is_configured():
            return False
        check = getattr(self._proxy, "is_enabled_for", None)
        return True if check is None else bool(check(level))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._proxy, name)


def get_logger(name: str, **initial: Any) -> Any:
    """A lazy logger for module ``name`` (configuration applied later still takes effect)."""
    return LibraryLogger(structlog.get_logger(name, logger_name=name, **initial))


_reported: dict[Hashable, set[Any]] = {}
H = TypeVar("H", bound=Hashable)
_reported_lock = threading.Lock()


def newly_reported(condition: Hashable, current: Iterable[H]) -> list[H]:
    """The members of ``current`` not yet reported for ``condition`` in this process.

    A warning about a lasting condition (jobs nobody can run) is worth one line
    per process, not one per check. Members that are no longer current are
    forgotten, so a condition that clears and comes back is reported again.
    """
    members = list(current)
    with _reported_lock:
        seen = _reported.get(condition, set())
        fresh = [m for m in members if m not in seen]
        _reported[condition] = set(members)
    return fresh
