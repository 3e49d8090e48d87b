"""An embedded PostgreSQL (the ``pgserver`` package) for tests, demos and local use.

Needs the ``embedded`` extra (``pip install -e '.[embedded]'`` in a clone of the
repository). The server runs from a data
directory; it is started on first use and stopped when the last process using
it exits.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import asyncpg

from .support.install import install_hint


class EmbeddedUnavailable(RuntimeError):
    """The embedded PostgreSQL cannot start here: its ``pgserver`` package is missing."""


def default_data_dir() -> Path:
    """Where the CLI keeps its embedded database between runs (per user)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "pg-scheduler" / "pgdata"


class EmbeddedPostgres:
    """A running embedded server; :attr:`dsn` connects to its ``postgres`` database."""

    def __init__(self, data_dir: str | Path | None = None, *, cleanup: str | None = "stop") -> None:
        try:
            with warnings.catch_warnings():
                # pgserver asks platformdirs for a runtime dir; without
                # XDG_RUNTIME_DIR it warns and uses /tmp, which is fine here.
                warnings.simplefilter("ignore")
                import pgserver
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise EmbeddedUnavailable(
                "the embedded PostgreSQL needs the 'pgserver' package (the embedded extra): "
                + install_hint("embedded")
            ) from exc
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self._server = pgserver.get_server(self.data_dir, cleanup_mode=cleanup)
        self.dsn: str = self._server.get_uri()

    def dsn_for(self, database: str) -> str:
        return self._server.get_uri(database)

    def stop(self) -> None:
        self._server.cleanup()


def is_running(data_dir: str | Path | None = None) -> bool:
    """Whether a server already runs from ``data_dir`` (default: the CLI's)."""
    pidfile = (Path(data_dir) if data_dir is not None else default_data_dir()) / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().splitlines()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def start(data_dir: str | Path | None = None, *, cleanup: str | None = "stop") -> EmbeddedPostgres:
    """Start (or attach to) the embedded server in ``data_dir``."""
    return EmbeddedPostgres(data_dir, cleanup=cleanup)


def default_dsn() -> str:
    """``$PG_SCHEDULER_DSN`` if set, else the embedded server's DSN.

    The embedded server (the ``embedded`` extra) uses the
    CLI's data directory, so ``pg-scheduler status`` sees the same jobs; it is
    started if needed and, when this process started it, stopped at exit.
    """
    configured = os.environ.get("PG_SCHEDULER_DSN")
    if configured:
        return configured
    return start(cleanup=None if is_running() else "stop").dsn


async def create_pool(data_dir: str | Path | None = None, **pool_options: Any) -> asyncpg.Pool:
    """An asyncpg pool on the embedded server (started if needed)."""
    server = start(data_dir)
    return await asyncpg.create_pool(server.dsn, **pool_options)
