"""Scheduler options for ``pg-scheduler worker tests.support.net_app:OPTIONS`` in the network
fault tests (the fault tasks, short timings, a short statement bound)."""

from __future__ import annotations

from typing import Any

from tests.support import fault_tasks  # registers the tasks

OPTIONS: dict[str, Any] = {
    **fault_tasks.CLI_OPTIONS,
    "heartbeat_threshold": 30.0,
    "lease_duration": 30.0,
    "statement_timeout": 1.0,
}
