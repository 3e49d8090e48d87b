"""What the operations commands print, and how they fail: exit codes, JSON, tables."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_BUSY = 3


class CommandError(Exception):
    """A failure to report on stderr with an exit code, without a traceback."""

    def __init__(self, message: str, code: int = EXIT_NOT_FOUND) -> None:
        super().__init__(message)
        self.code = code


def emit_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def console() -> Any:
    """A rich Console (imported here: rich is the optional ``cli`` extra)."""
    try:
        from rich.console import Console
    except ImportError:  # pragma: no cover - depends on the install
        raise CommandError(
            "tables need the 'rich' package: pip install 'pg-scheduler[cli]' (or use --json)"
        ) from None
    # Off a terminal (pipes, tests) do not squeeze tables into 80 columns.
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


_NUMERIC_COLUMNS = {
    "due",
    "scheduled",
    "running",
    "completed",
    "failed",
    "cancelled",
    "expired",
    "pid",
    "attempts",
    "per second",
    "failure rate",
    "deleted",
}


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Any:
    """A rich Table; numeric columns are right-aligned and None shows as ``-``."""
    from rich.table import Table

    view = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in columns:
        numeric = column in _NUMERIC_COLUMNS
        view.add_column(column, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        view.add_row(*("-" if v is None else str(v) for v in row))
    return view


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def window_name(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def first_line(text: str | None, width: int) -> str | None:
    """The first line of ``text``, cut to ``width`` characters."""
    if not text:
        return None
    line = text.strip().splitlines()[0]
    return line if len(line) <= width else line[: width - 1] + "…"
