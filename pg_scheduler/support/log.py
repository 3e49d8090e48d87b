"""The library's logging: stdlib ``logging`` loggers named ``pg_scheduler.*``,
with structlog on top only where the application configured structlog.

* Nothing configured (the usual library case): each line goes to the stdlib
  logger of its module, as ``event key=value ...``; DEBUG and INFO are dropped
  by the root logger's default level, and WARNING and above reach stderr
  through Python's last-resort handler. Nothing is ever printed to stdout.
* The application configures stdlib logging (``logging.basicConfig``, a
  ``dictConfig``): its handlers, levels and filters get the library's lines,
  with the fields also under ``record.pg_scheduler`` (a dict) for structured
  handlers.
* The application (or the CLI) configures structlog: structlog decides
  everything, as it did for the application's own lines.

The library never configures either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Iterable
from typing import Any, TypeVar

import structlog


class LibraryLogger:
    """One module's logger: stdlib ``logging`` unless the application configured structlog."""

    __slots__ = ("_initial", "_proxy", "_std")

    def __init__(self, proxy: Any, std: logging.Logger, initial: dict[str, Any]) -> None:
        self._proxy = proxy
        self._std = std
        self._initial = initial

    def _log(self, level: int, method: str, event: str, args: tuple, fields: dict) -> Any:
        if structlog.is_configured():
            return getattr(self._proxy, method)(event, *args, **fields)
        std = self._std
        if not std.isEnabledFor(level):
            return None
        exc_info = fields.pop("exc_info", None)
        if method == "exception" and exc_info is None:
            exc_info = True
        if args:
            event = event % args
        values = {**self._initial, **fields}
        text = " ".join([event, *(f"{k}={_shown(v)}" for k, v in values.items())])
        std.log(
            level,
            "%s",
            text,
            exc_info=exc_info,
            extra={"pg_scheduler": {"event": event, **values}},
            stacklevel=3,
        )
        return None

    def debug(self, event: str, *args: Any, **fields: Any) -> Any:
        return self._log(logging.DEBUG, "debug", event, args, fields)

    def info(self, event: str, *args: Any, **fields: Any) -> Any:
        return self._log(logging.INFO, "info", event, args, fields)

    def warning(self, event: str, *args: Any, **fields: Any) -> Any:
        return self._log(logging.WARNING, "warning", event, args, fields)

    def error(self, event: str, *args: Any, **fields: Any) -> Any:
        return self._log(logging.ERROR, "error", event, args, fields)

    def exception(self, event: str, *args: Any, **fields: Any) -> Any:
        return self._log(logging.ERROR, "exception", event, args, fields)

    def critical(self, event: str, *args: Any, **fields: Any) -> Any:
        return self._log(logging.CRITICAL, "critical", event, args, fields)

    def is_enabled_for(self, level: int) -> bool:
        if not structlog.is_configured():
            return self._std.isEnabledFor(level)
        check = getattr(self._proxy, "is_enabled_for", None)
        return True if check is None else bool(check(level))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._proxy, name)


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return repr(text) if isinstance(value, str) and (not text or " " in text) else text


def get_logger(name: str, **initial: Any) -> Any:
    """A lazy logger for module ``name`` (configuration applied later still takes effect)."""
    return LibraryLogger(
        structlog.get_logger(name, logger_name=name, **initial), logging.getLogger(name), initial
    )


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
