"""A worker in its own process, for fault injection, and the helpers tests drive it with.

As a script, from the repository root:
``python -m tests.support.fault_worker '{"heartbeat_threshold": 2, ...}'`` starts
a Scheduler on ``$PG_SCHEDULER_TEST_DB_URL`` with those options (``polling``
may hold PollingConfig fields), prints JSON lines on stdout (``ready``, and
``listener`` each time the LISTEN backend changes), and shuts down like the
CLI: the first SIGTERM/SIGINT gracefully, a second one forces.

As a module: :class:`WorkerProcess` starts and watches such a process (or a
``pg-scheduler worker`` CLI process), and :func:`restart_postgres` restarts
a private embedded server.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

# Fault-test timings: small enough that rescues happen in seconds.
FAULT: dict[str, Any] = dict(
    heartbeat_interval=0.3,
    heartbeat_threshold=2.0,
    lease_duration=3.0,
    rescue_interval=0.5,
    listener_health_interval=0.5,
    vacuum_enabled=False,
    run_periodic_jobs=False,
)
# Room for a loaded 2-core machine on top of every bound the tests check.
SLACK = 1.5


def metric(name: str, value: float) -> None:
    line = f"FAULT-METRIC {name}={value:.3f}"
    print(line)
    if os.environ.get("FAULT_METRICS_FILE"):  # collected across repeated runs
        with open(os.environ["FAULT_METRICS_FILE"], "a") as out:
            out.write(line + "\n")


# The repository root: the subprocess's working directory and PYTHONPATH.
ROOT = Path(__file__).resolve().parents[2]

# One row per execution phase of a fault task (see fault_tasks.record).
RUNS_DDL = """
CREATE TABLE IF NOT EXISTS fault_runs (
    run_id  text PRIMARY KEY,
    job_key text NOT NULL,
    pid     integer NOT NULL,
    phase   text NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS fault_runs_key_idx ON fault_runs (job_key, phase);
"""

# -- the subprocess ------------------------------------------------------------------


async def _serve(options: dict[str, Any]) -> None:
    import asyncpg

    from pg_scheduler import PollingConfig, Scheduler
    from tests.support import fault_tasks  # noqa: F401  (registers the tasks)

    polling = options.pop("polling", None)
    pool_size = int(options.pop("pool_size", 10))
    # The scheduler's pool may take another path to the database than the
    # tasks' records (tests/support/tcp_proxy.py); by default the same.
    url = os.environ.get("PG_SCHEDULER_WORKER_DB_URL") or os.environ["PG_SCHEDULER_TEST_DB_URL"]
    pool = await asyncpg.create_pool(url, min_size=2, max_size=pool_size)
    scheduler = Scheduler(
        pool, polling_config=PollingConfig(**polling) if polling else None, **options
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            scheduler.request_immediate_shutdown()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    def say(**fields: Any) -> None:
        print(json.dumps(fields), flush=True)

    await scheduler.start()
    say(event="ready", worker_id=scheduler.worker_id, pid=os.getpid())

    async def watch_listener() -> None:
        last: int | None = -1
        while True:
            pid = scheduler.listener.backend_pid
            if pid != last:
                say(event="listener", backend_pid=pid)
                last = pid
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch_listener())
    await stop.wait()
    await scheduler.shutdown()
    watcher.cancel()
    say(event="stopped")
    await pool.close()


def main() -> None:
    import structlog

    # Logs go to stderr (the test's log file); stdout carries only the events.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    options = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    asyncio.run(_serve(options))


# -- driving it from a test -------------------------------------------------------------


def subprocess_env(dsn: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PG_SCHEDULER_TEST_DB_URL"] = dsn
    env["PG_SCHEDULER_DSN"] = dsn
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class WorkerProcess:
    """One worker subprocess; its stdout events are collected as they arrive."""

    def __init__(self, proc: asyncio.subprocess.Process, log_path: Path, name: str) -> None:
        self.proc = proc
        self.log_path = log_path
        self.name = name
        self.events: list[dict[str, Any]] = []
        self.worker_id: str | None = None
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(
        cls, dsn: str, log_dir: Path, name: str, *, cli: bool = False, **options: Any
    ) -> WorkerProcess:
        """Start this module as a script (or, with ``cli``, ``pg-scheduler worker``)."""
        log_path = Path(log_dir) / f"{name}.log"
        if cli:
            argv = [
                sys.executable,
                "-c",
                "import sys; from pg_scheduler.cli import main; sys.exit(main())",
                "--log-level",
                "debug",
                "worker",
                "tests.support.fault_tasks:CLI_OPTIONS",
                *(str(a) for a in options.pop("cli_args", [])),
            ]
        else:
            argv = [sys.executable, "-m", "tests.support.fault_worker", json.dumps(options)]
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                env=subprocess_env(dsn),
                cwd=str(ROOT),
                start_new_session=True,
            )
        return cls(proc, log_path, name)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "ready":
                self.worker_id = event["worker_id"]
            self.events.append(event)
            self._changed.set()

    async def wait_event(self, name: str, timeout: float = 30.0, after: int = 0) -> dict[str, Any]:
        """The first event called ``name`` at index >= ``after``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for event in self.events[after:]:
                if event.get("event") == name:
                    return event
            if self.proc.returncode is not None:
                raise AssertionError(f"{self.name} exited: {self.log_tail()}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"{self.name}: no {name!r} event: {self.log_tail()}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.2))
            except TimeoutError:
                pass

    async def ready(self, timeout: float = 30.0) -> str:
        await self.wait_event("ready", timeout)
        assert self.worker_id is not None
        return self.worker_id

    @property
    def listener_pid(self) -> int | None:
        pids = [e["backend_pid"] for e in self.events if e.get("event") == "listener"]
        return pids[-1] if pids else None

    def send(self, sig: int) -> None:
        if self.proc.returncode is None:
            os.kill(self.proc.pid, sig)

    async def wait(self, timeout: float = 30.0) -> int:
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def close(self) -> None:
        """Make sure the process is gone (SIGKILL if needed)."""
        if self.proc.returncode is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(self.proc.pid, sig)
                except ProcessLookupError:
                    pass
            await self.proc.wait()
        self._reader.cancel()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]


def _pg_ctl(server: Any, *args: str) -> None:
    from pgserver._commands import POSTGRES_BIN_PATH

    inner = server._server
    subprocess.run(
        [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(inner.pgdata), "-w", "-t", "60", *args],
        check=True,
        user=inner.system_user,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=90,
    )


def stop_postgres(server: Any) -> None:
    """Stop a private embedded server (fast: sessions are terminated)."""
    _pg_ctl(server, "-m", "fast", "stop")


def start_postgres(server: Any) -> None:
    """Start it again with the options it last ran with (from postmaster.opts)."""
    import shlex

    pgdata = Path(server._server.pgdata)
    words = shlex.split((pgdata / "postmaster.opts").read_text())[1:]
    if "-D" in words:  # pg_ctl passes -D itself
        at = words.index("-D")
        del words[at : at + 2]
    options = " ".join(shlex.quote(w) for w in words)
    _pg_ctl(server, "-o", options, "-l", str(pgdata / "restart.log"), "start")


def restart_postgres(server: Any, mode: str = "fast") -> None:
    """Restart a private embedded server (``pg_scheduler.embedded.EmbeddedPostgres``)
    with its own pg_ctl, as the system user pgserver runs it under."""
    from pgserver._commands import POSTGRES_BIN_PATH

    inner = server._server
    pgdata = Path(inner.pgdata)
    subprocess.run(
        [
            str(POSTGRES_BIN_PATH / "pg_ctl"),
            "-D",
            str(pgdata),
            "-w",
            "-t",
            "60",
            "-m",
            mode,
            "-l",
            str(pgdata / "restart.log"),
            "restart",
        ],
        check=True,
        user=inner.system_user,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=90,
    )


if __name__ == "__main__":
    main()
