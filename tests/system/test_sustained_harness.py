"""The sustained-load harness end to end, for pg_scheduler only, with phases
of a few seconds: its outputs exist, no produced job was lost, and the
restart and kill phases did restart the server and SIGKILL a worker.

The harness starts its own embedded PostgreSQL (it restarts it), so this
test needs pgserver and nothing of the shared test database.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sustained.harness import PHASES
from tests.support.common import ROOT

pytestmark = pytest.mark.slow

# Short leases: a killed worker's jobs come back within the short run.
FAST_WORKER = {
    "heartbeat_interval": 0.2,
    "heartbeat_threshold": 2.0,
    "lease_duration": 3.0,
    "rescue_interval": 0.3,
}


def test_short_sustained_run(tmp_path: Path) -> None:
    pytest.importorskip("pgserver")
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.sustained",
            "run",
            "--contenders",
            "pg_scheduler",
            "--phase-seconds",
            "3",
            "--rate",
            "200",
            "--skip-capacity",
            "--sample-seconds",
            "0.5",
            "--kill-every",
            "1.5",
            "--final-wait",
            "15",
            "--options",
            json.dumps({"pg_scheduler": FAST_WORKER}),
            "--out",
            str(out),
            # The plots need matplotlib in a virtualenv of their own, built on
            # first use (minutes); the full run draws them.
            "--no-plots",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=85,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    summary = json.loads((out / "summary.json").read_text())
    (run,) = summary["contenders"]
    assert run["contender"] == "pg_scheduler"
    assert list(run["phases"]) == PHASES
    for phase in PHASES:
        assert run["phases"][phase]["jobs"] > 0, phase

    check = run["check"]
    assert check["produced"] > 8 * 3 * 200 * 0.5, check
    assert check["missing"] == 0, check

    events = {e["event"]: e for e in run["events"]}
    restarted = events["postgres_restart_done"]
    assert restarted["phase"] == "restart"
    assert restarted["postmaster_start"] != events["postgres_restart_begin"]["postmaster_start"]
    kills = [e for e in run["events"] if e["event"] == "worker_sigkill"]
    assert kills and all(e["phase"] == "kill" and e["code"] == -9 for e in kills)

    with (out / "samples-pg_scheduler.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["phase"] for r in rows} >= set(PHASES)
    assert any(k.endswith("scheduled_jobs:n_dead_tup") for k in rows[0])
    assert any(r["claim_p99_ms"] for r in rows)
