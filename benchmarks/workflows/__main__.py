"""Workflow benchmarks, pg_scheduler beside DBOS Transact:
``python -m benchmarks.workflows run [--quick] [--dsn DSN] ...``.

DBOS is installed from PyPI into its own virtualenv under ``benchmarks/.venvs/``
on first use; this repository's library runs in the current interpreter. Every
contender runs every scenario in a fresh database of the same PostgreSQL server
(the embedded one unless ``--dsn``), contenders alternated scenario by scenario.
Each run prints its JSON line (``RESULT {...}``); the end prints a table with
the ratio pg_scheduler/DBOS and the targets, and writes everything as JSON to
``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.__main__ import RESULTS, VENVS, Server

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DRIVER = HERE / "driver.py"
CRASH = HERE / "crash.py"

# name -> pip requirement (None: this repository, in the current interpreter)
CONTENDERS: dict[str, str | None] = {
    "pg_scheduler": None,
    "dbos": "dbos==3.4.0",
}
COMMON_REQUIREMENTS = ["asyncpg"]
SCENARIOS = ["step_overhead", "throughput", "plain", "parked", "fanout", "crash"]
OURS_ONLY = {"crash"}

FULL = {
    "step_n": 200,
    "step_steps": 10,
    "throughput_n": 2000,
    "throughput_steps": 5,
    "plain_n": 10_000,
    "parked_n": 10_000,
    "idle_seconds": 20,
    "fanout_n": 10_000,
    "crash_n": 1000,
    "crash_workers": 3,
    "crash_step_sleep_ms": 100,
    "repeat": 1,
}
QUICK = {
    "step_n": 50,
    "step_steps": 10,
    "throughput_n": 300,
    "throughput_steps": 5,
    "plain_n": 1000,
    "parked_n": 1000,
    "idle_seconds": 5,
    "fanout_n": 1000,
    "crash_n": 200,
    "crash_workers": 3,
    "crash_step_sleep_ms": 500,
    "repeat": 1,
}


def python_for(name: str) -> str:
    """The contender's interpreter: this one, or its own virtualenv (created on first use)."""
    requirement = CONTENDERS[name]
    if requirement is None:
        return sys.executable
    venv = VENVS / name
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if not marker.exists() or marker.read_text().strip() != requirement:
        print(f"[setup] creating {venv} with {requirement}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", requirement, *COMMON_REQUIREMENTS],
            check=True,
        )
        marker.write_text(requirement)
    return str(python)


def scenario_cfg(scenario: str, sizes: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    base = {"concurrency": args.concurrency, "dbos_polling": args.dbos_polling}
    if scenario == "step_overhead":
        return {**base, "n": sizes["step_n"], "steps": sizes["step_steps"], "timeout": 60}
    if scenario == "throughput":
        n, steps = sizes["throughput_n"], sizes["throughput_steps"]
        return {**base, "n": n, "steps": steps, "timeout": 900}
    if scenario == "plain":
        return {**base, "n": sizes["plain_n"], "timeout": 900}
    if scenario == "parked":
        n = sizes["parked_n"]
        return {
            **base,
            "n": n,
            "idle_seconds": sizes["idle_seconds"],
            "timeout": 900,
            "signal_one_by_one": args.signal_one_by_one,
        }
    if scenario == "fanout":
        return {**base, "n": sizes["fanout_n"], "timeout": 900}
    raise ValueError(scenario)


def run_driver(python: str, name: str, scenario: str, cfg: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if CONTENDERS[name] is None:
        env["PYTHONPATH"] = str(REPO)  # this tree's library
    try:
        proc = subprocess.run(
            [python, str(DRIVER), name, scenario, json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=cfg.get("timeout", 900) + 300,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1200:]}"}


def run_crash(dsn: str, sizes: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(CRASH),
        "--dsn",
        dsn,
        "--n",
        str(sizes["crash_n"]),
        "--workers",
        str(sizes["crash_workers"]),
        "--step-sleep",
        str(sizes["crash_step_sleep_ms"] / 1000),
        "--json",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1200:]}"}


def dig(result: dict[str, Any], path: str) -> Any:
    value: Any = result
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def median_of(runs: list[dict[str, Any]], path: str) -> Any:
    values = [dig(r, path) for r in runs if "error" not in r]
    values = [v for v in values if v is not None]
    if not values:
        return None
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return statistics.median(values)
    return values[-1]


# (scenario, path in its RESULT, label, which way is better)
METRICS = [
    ("step_overhead", "step_gap.p50_ms", "step gap p50 ms", "lower"),
    ("step_overhead", "step_gap.p99_ms", "step gap p99 ms", "lower"),
    ("step_overhead", "workflow_call.p50_ms", "10-step workflow call p50 ms", "lower"),
    ("throughput", "per_s", "workflows/s", "higher"),
    ("throughput", "steps_per_s", "steps/s", "higher"),
    ("plain", "per_s", "plain drain jobs/s", "higher"),
    ("parked", "park_s", "park all (s)", "lower"),
    ("parked", "running_rows_max", "running rows while parked", "lower"),
    ("parked", "bodies_in_memory_max", "bodies in memory while parked", "lower"),
    ("parked", "pool_in_use_max", "pool connections in use", "lower"),
    ("parked", "pool_in_use_idle_worker", "  of which the idle worker's own", "lower"),
    ("parked", "pool_in_use_for_parked", "pool connections for parked", "lower"),
    ("parked", "server_busy_backends_max", "busy server backends", "lower"),
    ("parked", "server_cpu_pct_of_core", "server CPU % of a core (idle)", "lower"),
    ("parked", "drain_per_s", "signal drain workflows/s", "higher"),
    ("parked", "drain_vs_plain", "signal drain / plain drain", "higher"),
    ("fanout", "e2e_s", "fan-out end to end (s)", "lower"),
    ("fanout", "resume_after_last_child_ms", "parent resume after last child ms", "lower"),
    ("fanout", "fanout_vs_plain", "fan-out / plain drain", "higher"),
    ("crash", "completed", "crash: workflows completed", "higher"),
    ("crash", "kills", "crash: kills", "higher"),
    ("crash", "steps_run_more_than_once", "crash: step repeats (killed runs)", "lower"),
]


def derived(results: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    """Add each contender's ratios to its own plain drain (rates, so sizes may differ)."""
    for runs in results.values():
        plain_rate = median_of(runs.get("plain", []), "per_s")
        if not plain_rate:
            continue
        for r in runs.get("parked", []):
            if r.get("drain_per_s"):
                r["drain_vs_plain"] = round(r["drain_per_s"] / plain_rate, 3)
        for r in runs.get("fanout", []):
            if r.get("children_per_s"):
                r["fanout_vs_plain"] = round(r["children_per_s"] / plain_rate, 3)


def targets(summary: dict[str, dict[str, Any]]) -> dict[str, bool | None]:
    """The request's targets for pg_scheduler (None: not measured in this run)."""
    ours = summary.get("pg_scheduler", {})
    peer = summary.get("dbos", {})

    def at_most(label: str, bound: float) -> bool | None:
        v = ours.get(label)
        return None if v is None else v <= bound

    def at_least(label: str, bound: float) -> bool | None:
        v = ours.get(label)
        return None if v is None else v >= bound

    def ahead(label: str, better: str) -> bool | None:
        a, b = ours.get(label), peer.get(label)
        if a is None or b is None:
            return None
        return a < b if better == "lower" else a > b

    return {
        "step gap p50 <= 1 ms": at_most("step gap p50 ms", 1.0),
        "step gap p99 <= 5 ms": at_most("step gap p99 ms", 5.0),
        "step gap p50 ahead of DBOS": ahead("step gap p50 ms", "lower"),
        "throughput ahead of DBOS": ahead("workflows/s", "higher"),
        "parked: 0 running rows": at_most("running rows while parked", 0),
        "parked: 0 pool connections for them": at_most("pool connections for parked", 0),
        "parked: server CPU < 2 % of a core": (
            None
            if ours.get("server CPU % of a core (idle)") is None
            else ours["server CPU % of a core (idle)"] < 2.0
        ),
        "parked: signal drain >= 0.8x plain": at_least("signal drain / plain drain", 0.8),
        "fan-out: resume <= 100 ms": at_most("parent resume after last child ms", 100.0),
        "fan-out: >= 0.7x plain": at_least("fan-out / plain drain", 0.7),
    }


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def print_table(summary: dict[str, dict[str, Any]], names: list[str]) -> None:
    header = ["metric", *names, "pg_scheduler/DBOS", "better"]
    rows = []
    for _, _, label, better in METRICS:
        values = [summary.get(n, {}).get(label) for n in names]
        if all(v is None for v in values):
            continue
        a, b = summary.get("pg_scheduler", {}).get(label), summary.get("dbos", {}).get(label)
        ratio = None
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
            ratio = round(a / b, 3)
        rows.append([label, *(fmt(v) for v in values), fmt(ratio), better])
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workflows")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the workflow benchmarks")
    run.add_argument("--quick", action="store_true", help="small sizes (~3 minutes)")
    run.add_argument("--dsn", help="PostgreSQL server DSN (default: embedded server)")
    run.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated")
    run.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated")
    run.add_argument("--concurrency", type=int, default=50)
    run.add_argument(
        "--signal-one-by-one",
        action="store_true",
        help="parked: signal each workflow with its own call (default: this library's "
        "signal_bulk in chunks; DBOS has one call per signal either way)",
    )
    run.add_argument(
        "--dbos-polling",
        type=float,
        default=0.01,
        help="DBOS queue polling_interval_sec and get_result polling (s; DBOS's default is 1)",
    )
    for key, value in FULL.items():
        run.add_argument(
            f"--{key.replace('_', '-')}",
            type=int,
            default=None,
            help=f"default {value} (quick: {QUICK[key]})",
        )
    run.add_argument("--out", help="JSON output path (default benchmarks/results/wf-<time>.json)")
    args = parser.parse_args(argv)

    sizes = dict(QUICK if args.quick else FULL)
    for key in FULL:
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    names = [n for n in args.contenders.split(",") if n]
    scenarios = [s for s in args.scenarios.split(",") if s]
    for n in names:
        if n not in CONTENDERS:
            parser.error(f"unknown contender {n!r}; one of {list(CONTENDERS)}")
    for s in scenarios:
        if s not in SCENARIOS:
            parser.error(f"unknown scenario {s!r}; one of {SCENARIOS}")
    pythons = {n: python_for(n) for n in names}
    server = Server(args.dsn)
    print(f"[server] {server.dsn}", flush=True)
    meta = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "sizes": sizes,
        "concurrency": args.concurrency,
        "dbos_polling": args.dbos_polling,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "postgres": server.describe(),
        "command": " ".join(["python -m benchmarks.workflows", *(argv or sys.argv[1:])]),
    }
    results: dict[str, dict[str, list[dict[str, Any]]]] = {n: {} for n in names}
    for scenario in scenarios:
        for rnd in range(sizes["repeat"]):
            order = names if rnd % 2 == 0 else list(reversed(names))
            for name in order:
                if scenario in OURS_ONLY and name != "pg_scheduler":
                    continue
                db, dsn = server.fresh_database(f"wf_{name}")
                print(f"[{scenario} {rnd + 1}/{sizes['repeat']}] {name}...", flush=True)
                try:
                    if scenario == "crash":
                        res = run_crash(dsn, sizes, args)
                    else:
                        cfg = {**scenario_cfg(scenario, sizes, args), "dsn": dsn}
                        res = run_driver(pythons[name], name, scenario, cfg)
                finally:
                    server.drop(db)
                res = {"contender": name, "scenario": scenario, **res}
                print("RESULT " + json.dumps(res), flush=True)
                results[name].setdefault(scenario, []).append(res)
    derived(results)
    summary: dict[str, dict[str, Any]] = {}
    for name, by_scenario in results.items():
        summary[name] = {
            label: median_of(by_scenario.get(scenario, []), path)
            for scenario, path, label, _ in METRICS
        }
    checks = {
        name: all(
            "error" not in r and r.get("check", {}).get("ok") is not False
            for runs in by_scenario.values()
            for r in runs
        )
        for name, by_scenario in results.items()
    }
    goals = targets(summary) if "pg_scheduler" in names else {}
    print()
    print_table(summary, names)
    print("\nchecks:", " ".join(f"{n}={'ok' if ok else 'FAILED'}" for n, ok in checks.items()))
    if goals:
        print("targets (pg_scheduler):")
        for goal, met in goals.items():
            print(f"  {goal:40} {fmt(met)}")
    for name, by_scenario in results.items():
        for scenario, runs in by_scenario.items():
            for r in runs:
                if "error" in r:
                    print(f"ERROR {name} {scenario}: {r['error'][-600:]}")
                elif r.get("check", {}).get("ok") is False:
                    print(f"CHECK FAILED {name} {scenario}: {json.dumps(r['check'])[:600]}")
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / f"wf-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "meta": meta,
                "summary": summary,
                "targets": goals,
                "checks": checks,
                "runs": results,
            },
            indent=2,
        )
    )
    print(f"\nJSON: {out}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
