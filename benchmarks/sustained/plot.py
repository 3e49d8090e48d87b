"""One PNG per phase from a sustained run's samples: ``python plot.py RESULTS_DIR``.

Runs in its own virtualenv (``benchmarks/.venvs/plot``, matplotlib; the
harness creates it on first use). Each figure has three panels over the
seconds into the phase, contenders overlaid: claim latency p50 (dashed) and
p99 (solid) per sample window, log scale; completed jobs/s; dead tuples of
the contender's job table.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def number(v: str | None) -> float | None:
    try:
        return float(v) if v not in (None, "") else None
    except ValueError:
        return None


def main(out: Path) -> None:
    summary = json.loads((out / "summary.json").read_text())
    runs = summary["contenders"]
    phases: list[str] = []
    for run in runs:
        for p in run["phases"]:
            if p not in phases:
                phases.append(p)
    rows = {
        run["contender"]: list(csv.DictReader((out / f"samples-{run['contender']}.csv").open()))
        for run in runs
    }
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, phase in enumerate(phases):
        fig, (lat, rate, dead) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
        for k, run in enumerate(runs):
            name, color = run["contender"], colors[k % len(colors)]
            dead_key = f"{run['job_table']}:n_dead_tup"
            mine = [r for r in rows[name] if r["phase"] == phase]
            t = [float(r["t_phase"]) for r in mine]

            def series(key: str, rows_: list[dict[str, str]] = mine) -> list[float | None]:
                return [number(r.get(key)) for r in rows_]

            lat.plot(t, series("claim_p99_ms"), color=color, label=f"{name} p99")
            lat.plot(t, series("claim_p50_ms"), color=color, linestyle="--", label=f"{name} p50")
            rate.plot(t, series("completed_per_s"), color=color, label=name)
            dead.plot(t, series(dead_key), color=color, label=name)
        lat.set_yscale("log")
        lat.axhline(20, color="grey", linewidth=0.8, linestyle=":")
        lat.set_ylabel("claim latency (ms)")
        rate.set_ylabel("completed jobs/s")
        dead.set_ylabel("dead tuples, job table")
        dead.set_xlabel("seconds into the phase")
        lat.legend(fontsize=7, ncol=3)
        rate.legend(fontsize=7)
        lat.set_title(f"phase {index + 1}: {phase}")
        fig.tight_layout()
        fig.savefig(out / f"phase-{index + 1}-{phase}.png", dpi=90)
        plt.close(fig)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
