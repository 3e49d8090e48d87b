"""The processes of a sustained run: ``python proc.py CONTENDER ROLE JSON``.

Runs in the contender's interpreter (its own virtualenv for a peer), so only
the standard library and the contender module's own imports are used here.
Roles:

``install``
    install the schema, print ``RESULT {...}`` (version, job table, depth
    query, relations to sample).
``producer``
    print ``READY``, then enqueue jobs as told on stdin: ``rate R`` (R jobs/s,
    evenly paced), ``depth D`` (keep the queue depth near D), ``stop`` (print
    ``RESULT {...}`` and exit). Each enqueued job appends a record to the
    ``records`` file: id, offered time, time the enqueue call returned.
``worker``
    run the contender's worker until SIGTERM; each job's handler sleeps 1 ms
    and appends a record: id, offered time, handler start, handler end.

Records are fixed-size binary (see ``PRODUCED`` and ``RAN``), written with
one ``os.write`` each (O_APPEND): what the kernel has is never lost to a
``kill -9`` of the writer.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import struct
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import asyncpg

HERE = Path(__file__).resolve().parent
PRODUCED = struct.Struct("<qdd")  # id, offered at, enqueue call returned at (unix s)
RAN = struct.Struct("<qddd")  # id, offered at, handler start, handler end
PAYLOAD_BYTES = 256
WORK_SECONDS = 0.001  # each job: await asyncio.sleep(0.001)
TICK = 0.005  # the producer's pacing step (s)
MAX_BATCH = 500  # jobs per enqueue call at most


def payload(i: int, offered: float) -> str:
    """The job's payload: ``id:offered-time:`` padded to 256 characters."""
    head = f"{i}:{offered!r}:"
    return head + "x" * (PAYLOAD_BYTES - len(head))


def parse(p: str) -> tuple[int, float]:
    i, offered, _ = p.split(":", 2)
    return int(i), float(offered)


def load(name: str) -> Any:
    path = HERE / "contenders" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"sustained_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Contender


async def install(c: Any, cfg: dict[str, Any]) -> None:
    await c.install()
    out = {
        "version": c.version,
        "job_table": c.job_table,
        "depth_sql": c.depth_sql,
        "relations": getattr(c, "relations", None),
    }
    print("RESULT " + json.dumps(out), flush=True)


def stdin_commands(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str]) -> None:
    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(queue.put_nowait, line.strip())
        loop.call_soon_threadsafe(queue.put_nowait, "stop")

    threading.Thread(target=read, daemon=True).start()


async def producer(c: Any, cfg: dict[str, Any]) -> None:
    fd = os.open(cfg["records"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    await c.open_producer()
    commands: asyncio.Queue[str] = asyncio.Queue()
    stdin_commands(asyncio.get_running_loop(), commands)
    print("READY", flush=True)
    mode, value = "rate", 0.0
    seg_start, seg_sent = time.time(), 0
    next_id = 0
    errors: list[dict[str, Any]] = []
    failed_calls = 0
    pending: list[str] = []  # a batch whose enqueue failed: retried as it is
    depth_conn: Any = None  # the --depth-target mode's own connection (asyncpg)
    while True:
        while not commands.empty():
            cmd = commands.get_nowait()
            if cmd == "stop":
                os.close(fd)
                await c.close()
                result = {
                    "produced": next_id - len(pending),
                    "failed_calls": failed_calls,
                    "errors": errors[:50],
                }
                print("RESULT " + json.dumps(result), flush=True)
                return
            mode, arg = cmd.split()
            value = float(arg)
            seg_start, seg_sent = time.time(), 0
        now = time.time()
        if not pending:
            if mode == "rate":
                due = int((now - seg_start) * value) - seg_sent
                n = max(0, min(due, MAX_BATCH))
                # Each job carries its slot in the even pace as its offered time.
                pending = [
                    payload(next_id + k, seg_start + (seg_sent + k + 1) / value) for k in range(n)
                ]
                seg_sent += n
            else:
                try:
                    if depth_conn is None or depth_conn.is_closed():
                        depth_conn = await asyncpg.connect(cfg["dsn"], timeout=5)
                    depth = await depth_conn.fetchval(c.depth_sql)
                except Exception as exc:
                    depth, depth_conn = value, None
                    failed_calls += 1
                    errors.append({"t": now, "call": "depth", "error": repr(exc)[:200]})
                n = max(0, min(int(value - depth), MAX_BATCH))
                pending = [payload(next_id + k, now) for k in range(n)]
            next_id += len(pending)
        if pending:
            try:
                await c.enqueue(pending)
            except Exception as exc:
                failed_calls += 1
                if len(errors) < 1000:
                    errors.append({"t": now, "call": "enqueue", "error": repr(exc)[:200]})
                await asyncio.sleep(0.2)  # back off, then retry the same batch
                continue
            done = time.time()
            os.write(fd, b"".join(PRODUCED.pack(*parse(p), done) for p in pending))
            pending = []
        await asyncio.sleep(max(0.0, TICK - (time.time() - now)))


async def worker(c: Any, cfg: dict[str, Any]) -> None:
    fd = os.open(cfg["records"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def handle(p: str) -> None:
        start = time.time()
        await asyncio.sleep(WORK_SECONDS)
        i, offered = parse(p)
        os.write(fd, RAN.pack(i, offered, start, time.time()))

    loop = asyncio.get_running_loop()
    run = asyncio.ensure_future(c.run_worker(handle))
    loop.add_signal_handler(signal.SIGTERM, run.cancel)
    loop.add_signal_handler(signal.SIGINT, run.cancel)
    print("READY", flush=True)
    try:
        await run
    except asyncio.CancelledError:
        return
    # The library's worker returned or raised by itself: say so, exit non-zero.
    print("worker returned by itself", file=sys.stderr, flush=True)
    sys.exit(3)


async def main() -> None:
    name, role, raw = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = json.loads(raw)
    contender = load(name)(cfg["dsn"], cfg.get("options", {}))
    try:
        await {"install": install, "producer": producer, "worker": worker}[role](contender, cfg)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(2)


if __name__ == "__main__":
    asyncio.run(main())
