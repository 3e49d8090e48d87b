"""A primary and its hot-standby streaming replica, each its own PostgreSQL
server (the pgserver binaries) in a temporary directory, on its own port."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pgserver  # type: ignore[import-untyped]

BIN = Path(pgserver.__file__).parent / "pginstall" / "bin"
TOOLS = ("initdb", "pg_ctl", "pg_basebackup")


def binaries_missing() -> str | None:
    """Why a primary and replica cannot be started here, or None."""
    for name in TOOLS:
        if not os.access(BIN / name, os.X_OK):
            return f"no {name} at {BIN}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("pgserver")
        except KeyError:
            return "running as root and no unprivileged user 'pgserver' to run PostgreSQL as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Pair:
    """``start()`` a primary and a replica streaming from it; ``stop()`` both
    and remove their directories. DSNs: :attr:`primary_dsn`, :attr:`replica_dsn`."""

    def __init__(self) -> None:
        self.user = "pgserver" if os.geteuid() == 0 else None
        self.root = Path(tempfile.mkdtemp(prefix="pgs-replica-"))
        self.primary = self.root / "primary"
        self.replica = self.root / "replica"
        self.primary_port = _free_port()
        self.replica_port = _free_port()
        self._started: list[Path] = []

    def _run(self, *command: str | Path) -> None:
        done = subprocess.run(
            [str(c) for c in command],
            user=self.user,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.root,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {done.stdout[-1500:]}{done.stderr[-1500:]}")

    def dsn(self, port: int) -> str:
        return f"postgresql://postgres@127.0.0.1:{port}/postgres"

    @property
    def primary_dsn(self) -> str:
        return self.dsn(self.primary_port)

    @property
    def replica_dsn(self) -> str:
        return self.dsn(self.replica_port)

    def _pg_ctl_start(self, data: Path, port: int) -> None:
        options = f"-p {port} -c listen_addresses=127.0.0.1 -k {self.root}"
        log = data / "server.log"
        self._run(BIN / "pg_ctl", "-D", data, "-l", log, "-o", options, "-w", "start")
        self._started.append(data)

    def start(self) -> Pair:
        if self.user is not None:
            shutil.chown(self.root, self.user)
        self._run(
            BIN / "initdb", "-D", self.primary, "-U", "postgres", "--auth=trust", "-E", "utf8"
        )
        with open(self.primary / "postgresql.conf", "a") as conf:
            conf.write("\nwal_level = replica\nmax_wal_senders = 5\nfsync = off\n")
        self._pg_ctl_start(self.primary, self.primary_port)
        self._run(
            BIN / "pg_basebackup",
            "-D",
            self.replica,
            "-R",
            "-X",
            "stream",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary_port),
            "-U",
            "postgres",
        )
        self._pg_ctl_start(self.replica, self.replica_port)
        return self

    def stop(self) -> None:
        for data in reversed(self._started):
            try:
                self._run(BIN / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        self._started.clear()
        shutil.rmtree(self.root, ignore_errors=True)
