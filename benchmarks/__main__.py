"""Side-by-side benchmarks: ``python -m benchmarks run [--quick] [--dsn DSN] ...``.

Each peer library is installed from PyPI into its own virtualenv under
``benchmarks/.venvs/`` (created on first use); this repository's library runs
in the current interpreter. Every contender runs every scenario in its own
fresh database on the same PostgreSQL server (the embedded one unless
``--dsn`` is given), scenario by scenario, contenders interleaved so that
background noise hits them alike. Results print as a table and are written
as JSON to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venvs"
RESULTS = HERE / "results"
DRIVER = HERE / "driver.py"

# name -> pip requirement (None: this repository, in the current interpreter)
CONTENDERS: dict[str, str | None] = {
    # The ceiling: claim + one acknowledgement per batch, no library (see its module).
    "raw_limit": None,
    "raw_limit_del": None,
    # The same two statements on this library's scheduled_jobs: what the table costs.
    "raw_limit_table": None,
    "pg_scheduler": None,
    "pg_scheduler_del": None,  # the same, completed rows deleted at once
    "pg_scheduler_notify": None,  # the same, no in-process start (latency only)
    "pg_scheduler_thread": None,  # plain def jobs in the thread pool (drain only)
    "pg_scheduler_nogc": None,  # the same with gc_freeze=False (latency only)
    "pgqueuer": "pgqueuer==1.6.0",
    "chancy": "chancy==0.26.0",
    "pg_scheduler_023": "pg-scheduler==0.2.3",
    "procrastinate": "procrastinate==3.10.0",
}
COMMON_REQUIREMENTS = ["asyncpg", "uvloop", "psycopg[binary]", "psycopg-pool"]

FULL = {
    "drain_n": 10_000,
    "drain_big_n": 50_000,
    "critical_backlog": 150_000,
    "critical_samples": 100,
    "latency_samples": 300,
    "backlog_n": 5_000,
    "backlog_future": 200_000,
    "big_backlog_future": 1_000_000,
    "enqueue_n": 100_000,
    "enqueue_singles": 1_000,
    "scale_n": 20_000,
    "queue_n": 5_000,
    "queue_foreign": 200_000,
    "startup_samples": 15,
    "repeat": 3,
}
QUICK = {
    "drain_n": 5_000,
    "drain_big_n": 20_000,
    "critical_backlog": 50_000,
    "critical_samples": 50,
    "latency_samples": 100,
    "backlog_n": 1_000,
    "backlog_future": 50_000,
    "big_backlog_future": 200_000,
    "enqueue_n": 20_000,
    "enqueue_singles": 300,
    "scale_n": 10_000,
    "queue_n": 5_000,
    "queue_foreign": 50_000,
    "startup_samples": 5,
    "repeat": 1,
}
SCENARIOS = [
    "enqueue",
    "latency",
    "latency_cross",
    "drain",
    "drain_big",
    "critical",
    "startup",
    "backlog",
    "big_backlog",
    "scaling",
]
# Queue scenarios: a worker next to a due backlog it cannot run (run them by name).
QUEUE_SCENARIOS = ["queue_empty", "queue_foreign", "queue_unregistered", "queue_idle_cpu"]
# Scenarios run for this library only (the peers take minutes per 1M rows).
# latency_cross and critical need a contender method the peers' modules lack.
OURS_ONLY = {"big_backlog", "scaling", "latency_cross", "critical", *QUEUE_SCENARIOS}
# ... and the raw limit, where it makes sense: the ceiling for the scaling curve.
SCALING_CONTENDERS = ("raw_limit", "pg_scheduler")
# Variants that differ from pg_scheduler in one scenario only run that one.
ONLY_IN = {
    "pg_scheduler_notify": {"latency"},
    "pg_scheduler_thread": {"drain"},
    "pg_scheduler_nogc": {"latency", "latency_cross", "critical"},
    # The limit is a throughput floor for the database work, not a latency design.
    "raw_limit": {"drain", "drain_big", "backlog", "big_backlog", "enqueue", "startup"},
    "raw_limit_del": {"drain", "drain_big"},
    "raw_limit_table": {"drain", "drain_big"},
}
DRIVER_SCENARIO = {
    "drain_big": "drain",
    "big_backlog": "backlog",
    "queue_empty": "foreign",
    "queue_foreign": "foreign",
    "queue_unregistered": "foreign",
    "queue_idle_cpu": "idle_cpu",
}


def python_for(name: str) -> str:
    return venv_python(name, CONTENDERS[name])


def venv_python(name: str, requirement: str | None) -> str:
    """The interpreter of virtualenv ``benchmarks/.venvs/NAME`` with ``requirement``
    (and the common requirements) installed, created on first use; this
    interpreter when ``requirement`` is None."""
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


def with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


class Server:
    def __init__(self, dsn: str | None) -> None:
        self._embedded = None
        if dsn is None:
            from pg_scheduler.embedded import start

            data_dir = Path(tempfile.mkdtemp(prefix="pgs-bench-")) / "pgdata"
            self._embedded = start(data_dir, cleanup="delete")
            dsn = self._embedded.dsn
        self.dsn = dsn

    def _admin(self, sql: str) -> Any:
        import asyncpg

        async def go() -> Any:
            conn = await asyncpg.connect(self.dsn)
            try:
                return await conn.fetch(sql)
            finally:
                await conn.close()

        return asyncio.run(go())

    def fresh_database(self, label: str) -> tuple[str, str]:
        name = f"bench_{label}_{uuid.uuid4().hex[:6]}"
        self._admin(f'CREATE DATABASE "{name}"')
        return name, with_database(self.dsn, name)

    def drop(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def describe(self) -> dict[str, Any]:
        rows = self._admin(
            "SELECT version() AS v, current_setting('shared_buffers') AS sb, "
            "current_setting('synchronous_commit') AS sc, current_setting('max_connections') AS mc"
        )
        r = rows[0]
        return {
            "version": r["v"],
            "shared_buffers": r["sb"],
            "synchronous_commit": r["sc"],
            "max_connections": r["mc"],
        }


def run_driver(
    python: str, name: str, scenario: str, cfg: dict[str, Any], timeout: float
) -> dict[str, Any]:
    proc = subprocess.run(
        [python, str(DRIVER), name, scenario, json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr or proc.stdout)[-2000:]
    return {"error": f"exit {proc.returncode}: {tail}"}


def run_scaling(
    server: Server, python: str, cfg: dict[str, Any], procs: int, name: str = "pg_scheduler"
) -> dict[str, Any]:
    """K worker processes of one contender, released together, draining N due jobs."""
    db, dsn = server.fresh_database(f"scale{procs}")
    try:
        base = {**cfg, "dsn": dsn}
        enq = run_driver(python, name, "scale_enqueue", base, 600)
        if "error" in enq:
            return enq
        RESULTS.mkdir(exist_ok=True)
        errlog = (RESULTS / "scaling-workers.log").open("a")
        workers = [
            subprocess.Popen(
                [python, str(DRIVER), name, "scale_worker", json.dumps(base)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errlog,
                text=True,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            for _ in range(procs)
        ]
        # Read every worker's output continuously: a full pipe would stall it.
        outputs: list[list[str]] = [[] for _ in workers]
        ready = [threading.Event() for _ in workers]

        def pump(index: int) -> None:
            stream = workers[index].stdout
            assert stream is not None
            for line in stream:
                if line.startswith("READY"):
                    ready[index].set()
                elif line.startswith("RESULT "):
                    outputs[index].append(line)
                else:
                    errlog.write(line)

        readers = [threading.Thread(target=pump, args=(i,), daemon=True) for i in range(procs)]
        for t in readers:
            t.start()
        for event in ready:
            event.wait(120)
        for w in workers:
            assert w.stdin is not None
            w.stdin.write("go\n")
            w.stdin.flush()
        for w, t in zip(workers, readers, strict=True):
            w.wait(600)
            t.join(10)
        results = [json.loads(line[7:]) for out in outputs for line in out]
        if len(results) != procs:
            return {"error": "a worker process failed"}
        go = min(r["go"] for r in results)
        end = max(r["last_end"] for r in results)
        seen: dict[int, int] = {}
        for r in results:
            for i in r["counts"]:
                seen[i] = seen.get(i, 0) + 1
        n = cfg["n"]
        missing = n - len(seen)
        dup = sum(1 for v in seen.values() if v > 1) + sum(r["dups"] for r in results)
        return {
            "contender": name,
            "processes": procs,
            "jobs": n,
            "seconds": round(end - go, 3),
            "jobs_per_s": round(n / (end - go), 1),
            "per_process": [r["ran"] for r in results],
            "check": {"missing": missing, "duplicated": dup, "ok": missing == 0 and dup == 0},
        }
    finally:
        server.drop(db)


def scenario_cfg(scenario: str, sizes: dict[str, Any], concurrency: int) -> dict[str, Any]:
    c = {"concurrency": concurrency}
    if scenario == "drain":
        return {**c, "n": sizes["drain_n"], "timeout": 300}
    if scenario == "drain_big":
        return {**c, "n": sizes["drain_big_n"], "timeout": 600}
    if scenario == "critical":
        n = sizes["critical_backlog"]
        # 20 ms apart: 100 samples take ~2.2 s, inside a 150k drain even at
        # 60k jobs/s (50 ms apart outlasted it at 33k/s).
        return {**c, "n": n, "samples": sizes["critical_samples"], "gap": 0.02, "timeout": 600}
    if scenario == "latency_cross":
        return {**c, "samples": sizes["latency_samples"]}
    if scenario == "latency":
        return {**c, "samples": sizes["latency_samples"]}
    if scenario == "backlog":
        return {**c, "n": sizes["backlog_n"], "future": sizes["backlog_future"], "timeout": 400}
    if scenario == "big_backlog":
        return {**c, "n": sizes["drain_n"], "future": sizes["big_backlog_future"], "timeout": 400}
    if scenario == "enqueue":
        return {**c, "n": sizes["enqueue_n"], "singles": sizes["enqueue_singles"]}
    if scenario == "scaling":
        return {**c, "n": sizes["scale_n"]}
    kinds = {"queue_empty": "none", "queue_foreign": "queue", "queue_unregistered": "task"}
    if scenario in kinds:
        foreign = sizes["queue_foreign"]
        n = sizes["queue_n"]
        return {**c, "n": n, "foreign": foreign, "kind": kinds[scenario], "timeout": 300}
    if scenario == "queue_idle_cpu":
        return {**c, "foreign": sizes["queue_foreign"], "seconds": 20, "rate": 10}
    if scenario == "startup":
        return {**c, "samples": sizes["startup_samples"]}
    raise ValueError(scenario)


def queue_ratios(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The queue scenarios' figures: each backlog drain against the empty-table drain."""
    out: dict[str, Any] = {}
    empty = median_of(runs.get("queue_empty", []), "jobs_per_s")
    for scenario in ("queue_foreign", "queue_unregistered"):
        rate = median_of(runs.get(scenario, []), "jobs_per_s")
        if rate is not None:
            out[f"{scenario}_jobs_per_s"] = rate
            if empty:
                out[f"{scenario}_vs_empty"] = round(rate / empty, 3)
    if empty is not None:
        out["queue_empty_jobs_per_s"] = empty
    cpu = median_of(runs.get("queue_idle_cpu", []), "server_cpu_pct_of_core")
    if cpu is not None:
        out["queue_idle_server_cpu_pct"] = cpu
    return out


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None and "error" not in r]
    return statistics.median(values) if values else None


def summarize(results: dict[str, dict[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    rows = []
    for name, by_scenario in results.items():
        row: dict[str, Any] = {"contender": name}
        for scenario, key, label in (
            ("drain", "jobs_per_s", "drain_jobs_per_s"),
            ("drain_big", "jobs_per_s", "drain_big_jobs_per_s"),
            ("latency", "p50_ms", "latency_p50_ms"),
            ("latency", "p99_ms", "latency_p99_ms"),
            ("latency_cross", "p50_ms", "latency_cross_p50_ms"),
            ("latency_cross", "p99_ms", "latency_cross_p99_ms"),
            ("critical", "p50_ms", "critical_p50_ms"),
            ("critical", "p99_ms", "critical_p99_ms"),
            ("backlog", "jobs_per_s", "backlog_jobs_per_s"),
            ("big_backlog", "jobs_per_s", "big_backlog_jobs_per_s"),
            ("enqueue", "bulk_per_s", "bulk_enqueue_per_s"),
            ("enqueue", "single_p50_ms", "single_enqueue_p50_ms"),
            ("drain", "rss_peak_mb", "drain_rss_peak_mb"),
            # CPU per job of the 50k drain: the worker process's, the server's.
            ("drain_big", "python_cpu_us_per_job", "drain_big_worker_cpu_us"),
            ("drain_big", "server_cpu_us_per_job", "drain_big_server_cpu_us"),
            ("startup", "first_job_p50_ms", "startup_first_job_p50_ms"),
            ("startup", "cold_first_job_ms", "startup_cold_first_job_ms"),
        ):
            runs = by_scenario.get(scenario, [])
            row[label] = median_of(runs, key)
        checks = [
            r.get("check", {}).get("ok")
            for runs in by_scenario.values()
            for r in runs
            if isinstance(r, dict)
        ]
        errors = [r["error"][-300:] for runs in by_scenario.values() for r in runs if "error" in r]
        row["all_checks_ok"] = all(c is not False for c in checks) and not errors
        row["errors"] = errors
        rows.append(row)
    return rows


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"
    return str(value)


def print_table(rows: list[dict[str, Any]], scaling: list[dict[str, Any]]) -> None:
    columns = [
        ("contender", "contender"),
        ("drain_jobs_per_s", "drain jobs/s"),
        ("drain_big_jobs_per_s", "big drain jobs/s"),
        ("latency_p50_ms", "lat p50 ms"),
        ("latency_p99_ms", "lat p99 ms"),
        ("latency_cross_p50_ms", "x-proc p50"),
        ("latency_cross_p99_ms", "x-proc p99"),
        ("critical_p99_ms", "CRIT p99 ms"),
        ("backlog_jobs_per_s", "backlog jobs/s"),
        ("big_backlog_jobs_per_s", "1M-backlog jobs/s"),
        ("bulk_enqueue_per_s", "bulk enq/s"),
        ("single_enqueue_p50_ms", "schedule p50 ms"),
        ("drain_big_worker_cpu_us", "worker µs/job"),
        ("drain_big_server_cpu_us", "server µs/job"),
        ("drain_rss_peak_mb", "drain RSS MB"),
        ("startup_first_job_p50_ms", "start->1st job ms"),
        ("startup_cold_first_job_ms", "cold start ms"),
        ("all_checks_ok", "checks"),
    ]
    widths = [max(len(h), *(len(fmt(r.get(k))) for r in rows)) for k, h in columns]
    print(" | ".join(h.ljust(w) for (_, h), w in zip(columns, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(fmt(r.get(k)).ljust(w) for (k, _), w in zip(columns, widths, strict=True)))
    if scaling:
        print("\nscaling (due-job drain, K worker processes):")
        for s in scaling:
            print(
                f"  {s.get('contender', 'pg_scheduler')} {s.get('processes')} process(es): "
                f"{fmt(s.get('jobs_per_s'))} jobs/s "
                f"split {s.get('per_process')} checks={s.get('check', {}).get('ok')}"
            )
    for r in rows:
        for e in r["errors"]:
            print(f"ERROR {r['contender']}: {e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the side-by-side benchmarks")
    run.add_argument("--quick", action="store_true", help="small sizes, one repeat (~2 min)")
    run.add_argument("--dsn", help="PostgreSQL server DSN (default: embedded server)")
    run.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated")
    run.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated")
    run.add_argument("--concurrency", type=int, default=50)
    run.add_argument(
        "--scale-procs",
        "--procs",
        dest="scale_procs",
        default="1,2,4",
        help="worker processes of the scaling scenario (comma-separated)",
    )
    for key, value in FULL.items():
        run.add_argument(
            f"--{key.replace('_', '-')}",
            type=int,
            default=None,
            help=f"default {value} (quick: {QUICK[key]})",
        )
    run.add_argument("--out", help="JSON output path (default benchmarks/results/<time>.json)")
    run.add_argument(
        "--uvloop", action="store_true", help="run every contender on uvloop (default: asyncio)"
    )
    args = parser.parse_args(argv)

    sizes = dict(QUICK if args.quick else FULL)
    for key in FULL:
        value = getattr(args, key)
        if value is not None:
            sizes[key] = value
    names = [n for n in args.contenders.split(",") if n]
    scenarios = [s for s in args.scenarios.split(",") if s]
    for n in names:
        if n not in CONTENDERS:
            parser.error(f"unknown contender {n!r}; one of {list(CONTENDERS)}")
    pythons = {n: python_for(n) for n in names}
    if args.uvloop:
        os.environ["PGS_BENCH_UVLOOP"] = "1"
    server = Server(args.dsn)
    print(f"[server] {server.dsn}", flush=True)
    meta = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "sizes": sizes,
        "concurrency": args.concurrency,
        "event_loop": "uvloop" if args.uvloop else "asyncio",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "postgres": server.describe(),
        "command": " ".join(["python -m benchmarks", *(argv or sys.argv[1:])]),
    }
    results: dict[str, dict[str, list[dict[str, Any]]]] = {n: {} for n in names}
    scaling: list[dict[str, Any]] = []
    for scenario in scenarios:
        if scenario == "scaling":
            cfg = scenario_cfg("scaling", sizes, args.concurrency)
            for procs in (int(p) for p in args.scale_procs.split(",")):
                for name in SCALING_CONTENDERS:
                    if name not in names:
                        continue
                    print(f"[scaling] {name} {procs} process(es)...", flush=True)
                    res = run_scaling(server, pythons[name], cfg, procs, name)
                    print(f"  -> {json.dumps(res)[:300]}", flush=True)
                    scaling.append(res)
            continue
        repeat = sizes["repeat"] if scenario in ("drain", "drain_big", "latency") else 1
        for rnd in range(repeat):
            for name in names:
                if scenario in OURS_ONLY and name not in (
                    "pg_scheduler",
                    "pg_scheduler_nogc",
                    "raw_limit",
                ):
                    continue
                if scenario not in ONLY_IN.get(name, {scenario}):
                    continue
                db, dsn = server.fresh_database(name)
                cfg = {**scenario_cfg(scenario, sizes, args.concurrency), "dsn": dsn}
                print(f"[{scenario} {rnd + 1}/{repeat}] {name}...", flush=True)
                try:
                    driver_scenario = DRIVER_SCENARIO.get(scenario, scenario)
                    res = run_driver(pythons[name], name, driver_scenario, cfg, timeout=900)
                except subprocess.TimeoutExpired:
                    res = {"error": "timed out"}
                finally:
                    server.drop(db)
                brief = {k: v for k, v in res.items() if k not in ("version",)}
                print(f"  -> {json.dumps(brief)[:400]}", flush=True)
                results[name].setdefault(scenario, []).append(res)
    rows = summarize(results)
    ours = next((r for r in rows if r["contender"] == "pg_scheduler"), None)
    pgq = next((r for r in rows if r["contender"] == "pgqueuer"), None)
    ratios = {}
    if ours and pgq and ours["drain_jobs_per_s"] and pgq["drain_jobs_per_s"]:
        ratios["drain_vs_pgqueuer"] = round(ours["drain_jobs_per_s"] / pgq["drain_jobs_per_s"], 2)
    dele = next((r for r in rows if r["contender"] == "pg_scheduler_del"), None)
    if dele and pgq and dele["drain_jobs_per_s"] and pgq["drain_jobs_per_s"]:
        ratios["drain_del_vs_pgqueuer"] = round(
            dele["drain_jobs_per_s"] / pgq["drain_jobs_per_s"], 2
        )
    # The share of the raw limit (same run, same acknowledgement mode).
    for mine, limit, label in (
        ("pg_scheduler", "raw_limit", "drain_vs_raw_limit"),
        ("pg_scheduler_del", "raw_limit_del", "drain_del_vs_raw_limit_del"),
        # Where the gap is: the table's share of the limit, and the library's of the table's.
        ("raw_limit_table", "raw_limit", "table_limit_vs_raw_limit"),
        ("pg_scheduler", "raw_limit_table", "drain_vs_table_limit"),
    ):
        a = next((r for r in rows if r["contender"] == mine), None)
        b = next((r for r in rows if r["contender"] == limit), None)
        for key, suffix in (("drain_jobs_per_s", ""), ("drain_big_jobs_per_s", "_big")):
            if a and b and a[key] and b[key]:
                ratios[label + suffix] = round(a[key] / b[key], 3)
    for peer in ("pgqueuer", "procrastinate", "chancy", "pg_scheduler_023"):
        other = next((r for r in rows if r["contender"] == peer), None)
        if ours and other and ours["drain_big_jobs_per_s"] and other["drain_big_jobs_per_s"]:
            ratios[f"drain_big_vs_{peer}"] = round(
                ours["drain_big_jobs_per_s"] / other["drain_big_jobs_per_s"], 2
            )
    by_procs: dict[tuple[str, int], float] = {
        (s.get("contender", "pg_scheduler"), s["processes"]): s["jobs_per_s"]
        for s in scaling
        if "jobs_per_s" in s
    }
    for (name, procs), rate in by_procs.items():
        limit_rate = by_procs.get(("raw_limit", procs))
        if name == "pg_scheduler" and limit_rate:
            ratios[f"scaling_{procs}p_vs_raw_limit"] = round(rate / limit_rate, 3)
    if ours and ours["drain_jobs_per_s"] and ours["big_backlog_jobs_per_s"]:
        ratios["big_backlog_vs_empty"] = round(
            ours["big_backlog_jobs_per_s"] / ours["drain_jobs_per_s"], 3
        )
    queue_runs = {
        s: results["pg_scheduler"].get(s, [])
        for s in QUEUE_SCENARIOS
        if "pg_scheduler" in results and results["pg_scheduler"].get(s)
    }
    if queue_runs:
        ratios.update(queue_ratios(queue_runs))
    print()
    print_table(rows, scaling)
    if ratios:
        print("\nratios:", json.dumps(ratios))
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / f"{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {"meta": meta, "summary": rows, "ratios": ratios, "scaling": scaling, "runs": results},
            indent=2,
        )
    )
    print(f"\nJSON: {out}")
    return 0 if all(r["all_checks_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
