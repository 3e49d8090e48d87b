"""What the A/B tools share: one server, a fresh database per run, a child
script run inside each checkout (so it imports that tree's library), the
checkouts alternated round by round, medians.

Used by ``ab_drain.py`` and ``enqueue_profile.py``, and the latency probes
(imported as a sibling: they run as scripts from ``benchmarks/``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg


def probe_arguments(doc: str) -> argparse.Namespace:
    """The command line of the latency probes (``idle_wakeup.py``,
    ``xproc_breakdown.py``): ``--dsn``, ``--samples``, ``--gap-ms``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--dsn", help="PostgreSQL server (default: an embedded one)")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    return parser.parse_args()


def server_dsn(dsn: str | None, prefix: str) -> str:
    """``dsn``, or the DSN of an embedded server started in a temporary directory
    (removed when this process exits)."""
    if dsn:
        return dsn
    from pg_scheduler.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix=prefix)) / "pgdata", cleanup="delete")
    return server.dsn


def database_dsn(dsn: str, database: str) -> str:
    """``dsn`` pointed at ``database`` (keeping its ``?host=...`` part)."""
    base, _, query = dsn.partition("?")
    return base.rsplit("/", 1)[0] + "/" + database + ("?" + query if query else "")


async def admin(dsn: str, sql: str) -> None:
    """Run one statement on its own connection (CREATE/DROP DATABASE, DROP INDEX)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def run_child(dsn: str, tree: str, child: str, args: Sequence[str]) -> tuple[dict[str, Any], str]:
    """Run ``child`` (Python source) in ``tree`` on a fresh database of ``dsn``:
    its ``RESULT {...}`` line (or ``{"error": ...}``), and its whole stdout."""
    db = f"ab_{uuid.uuid4().hex[:8]}"
    asyncio.run(admin(dsn, f'CREATE DATABASE "{db}"'))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", child, database_dsn(dsn, db), *args],
            cwd=tree,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": tree},
        )
    finally:
        asyncio.run(admin(dsn, f'DROP DATABASE "{db}" WITH (FORCE)'))
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[0][7:]) if line else {"error": proc.stderr[-800:]}
    return result, proc.stdout


def alternate(
    trees: Sequence[str],
    rounds: int,
    run: Callable[[str], dict[str, Any]],
    keys: Sequence[str],
) -> None:
    """``run`` each tree once per round, in turn (every other round reversed),
    printing each result, then each tree's medians of ``keys``."""
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
    for rnd in range(rounds):
        for tree in trees if rnd % 2 == 0 else list(reversed(trees)):
            res = run(tree)
            results[tree].append(res)
            print(rnd, tree, res, flush=True)
    for tree, runs in results.items():
        ok = [r for r in runs if "error" not in r]
        if ok:
            med = {k: statistics.median(r[k] for r in ok) for k in keys}
            print("MEDIAN", tree, med, "runs", [r[keys[0]] for r in ok])
