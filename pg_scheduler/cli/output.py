"""What the operations commands print, and how they fail: exit codes, JSON, tables.

Tables use rich when it is installed (the ``cli`` extra) and plain aligned text
otherwise, so an install without extras gives a working ``status``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from ..enums import FINAL_STATUS_VALUES

EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_BUSY = 3
EXIT_INTERRUPTED = 130  # the shell's code for SIGINT


class CommandError(Exception):
    """A failure to report on stderr with an exit code, without a traceback."""

    def __init__(self, message: str, code: int = EXIT_NOT_FOUND) -> None:
        super().__init__(message)
        self.code = code


# -- JSON -------------------------------------------------------------------------------


def iso_utc(value: datetime) -> str:
    """One time format in every JSON document: ISO 8601 in UTC, ``Z`` suffix."""
    if value.tzinfo is None:
        value = value.astimezone()
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def json_value(value: Any) -> Any:
    """``value`` made JSON-ready the one way every command shares."""
    if isinstance(value, datetime):
        return iso_utc(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if hasattr(value, "model_dump"):
        return json_value(value.model_dump())
    return value


def emit_json(value: Any, *, indent: int | None = 2) -> None:
    print(json.dumps(json_value(value), indent=indent, default=str), flush=True)


# -- tables -----------------------------------------------------------------------------


def has_rich() -> bool:
    try:
        import rich.console  # noqa: F401
    except ImportError:
        return False
    return True


def _width() -> int | None:
    # Off a terminal (pipes, tests) do not squeeze tables into 80 columns.
    if sys.stdout.isatty():
        return None
    try:
        return int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return 160


class PlainConsole:
    """The part of rich's Console the commands use, printing plain text."""

    _MARKUP = re.compile(r"\[/?bold\]")

    def __init__(self, file: Any = None) -> None:
        self.file = file

    def print(self, value: Any = "", markup: bool = True, **_: Any) -> None:
        text = str(value)
        if markup and isinstance(value, str):
            text = self._MARKUP.sub("", text)
        print(text, file=self.file or sys.stdout)


def console(file: Any = None, terminal: bool | None = None) -> Any:
    """A rich Console when rich is installed, else a plain one. ``terminal``: style
    the output as for a terminal even when it goes to ``file`` first."""
    if not has_rich():
        return PlainConsole(file)
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    class UncroppedConsole(Console):
        # A table that cannot fit the terminal without breaking an id is laid out
        # wider (the terminal wraps its lines), never squeezed or cut.
        def print(self, *objects: Any, **options: Any) -> None:
            tables = [o for o in objects if isinstance(o, Table)]
            width = self.width
            if tables:
                wide = self.options.update_width(100_000)
                needed = max(Measurement.get(self, wide, t).minimum for t in tables)
                if needed > width:
                    self.width = needed
            try:
                super().print(*objects, **options)
            finally:
                self.width = width

    return UncroppedConsole(width=_width(), highlight=False, file=file, force_terminal=terminal)


_NUMERIC_COLUMNS = {
    "due",
    "scheduled",
    "running",
    "waiting",
    *FINAL_STATUS_VALUES,
    "pid",
    "attempts",
    "per second",
    "failure rate",
    "deleted",
    "would delete",
    "ms",
}
# Identifiers are copied into the next command: never wrapped or cut.
_ID_COLUMNS = {"job id", "worker", "dedup key", "task", "job name"}


class PlainTable:
    """Aligned columns separated by two spaces; nothing wraps."""

    def __init__(
        self,
        title: str | None,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        header: bool = True,
    ) -> None:
        self.title = title
        self.columns = list(columns)
        self.rows = [["-" if v is None else str(v) for v in row] for row in rows]
        self.header = header

    def __str__(self) -> str:
        lines = [self.columns, *self.rows] if self.header else list(self.rows)
        widths = [max((len(r[i]) for r in lines), default=0) for i in range(len(self.columns))]
        out = [self.title] if self.title else []
        for n, row in enumerate(lines):
            cells = [
                cell.rjust(w) if self.columns[i] in _NUMERIC_COLUMNS else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ]
            out.append("  ".join(cells).rstrip())
            if self.header and n == 0:
                out.append("  ".join("-" * w for w in widths))
        return "\n".join(out)


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    header: bool = True,
) -> Any:
    """A table for ``console().print``: numeric columns right-aligned, None as ``-``,
    identifiers never wrapped."""
    if not has_rich():
        return PlainTable(title, columns, rows, header)
    from rich import box
    from rich.table import Table

    view = Table(
        title=title,
        title_justify="left",
        show_edge=False,
        pad_edge=False,
        show_header=header,
        box=box.HEAVY_HEAD if header else None,
    )
    cells = [["-" if v is None else str(v) for v in row] for row in rows]
    for i, column in enumerate(columns):
        if column in _ID_COLUMNS:
            widest = max((len(r[i]) for r in cells), default=0)
            view.add_column(column, no_wrap=True, min_width=max(widest, len(column)))
        else:
            numeric = column in _NUMERIC_COLUMNS
            view.add_column(column, justify="right" if numeric else "left", overflow="fold")
    for row in cells:
        view.add_row(*row)
    return view


# -- confirmation -------------------------------------------------------------------------


def interactive() -> bool:
    """Whether a person can answer on stdin (a terminal)."""
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, OSError, ValueError):
        return False


def confirm(question: str, args: Any) -> None:
    """Go on only with ``--yes`` or a "y" typed at a terminal; else CommandError.

    Without a terminal nobody can answer, and a destructive action must never
    run silently: refuse, and say how to go on.
    """
    if getattr(args, "yes", False):
        return
    if not interactive():
        raise CommandError(
            f"{question}: refusing without confirmation (stdin is not a terminal); "
            "pass --yes to go ahead (--dry-run shows what would change)",
            EXIT_USAGE,
        )
    print(f"{question}? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise CommandError("aborted: nothing changed", EXIT_USAGE)


# -- formatting ---------------------------------------------------------------------------


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
