"""Ctrl-C on ``pg-scheduler dashboard`` while a browser tab holds its event
stream: the stream ends, the server stops at once and quietly (no traceback,
no cancelled tasks); its start line reads cleanly."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time

import httpx

from tests.support.common import child_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_ctrl_c_with_an_open_event_stream_exits_cleanly(dsn, pool):
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pg_scheduler.cli",
        "--dsn",
        dsn,
        "dashboard",
        "--port",
        str(port),
        env=child_env(dsn),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().strip()
        assert line == f"pg_scheduler dashboard on http://127.0.0.1:{port}/ (read-only: no --token)"
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("GET", f"http://127.0.0.1:{port}/api/stream") as stream:
                chunks = stream.aiter_text()
                first = await asyncio.wait_for(anext(chunks), 30)
                assert '"live": true' in first
                proc.send_signal(signal.SIGINT)
                started = time.monotonic()
                # The server ends the stream itself: the rest arrives, then EOF.
                async for _ in chunks:
                    pass
        code = await asyncio.wait_for(proc.wait(), 30)
        # Well within uvicorn's graceful-shutdown timeout (2 s): nothing was cancelled.
        assert time.monotonic() - started < 2.0
        err = (await proc.stderr.read()).decode()
        assert code == 0, err
        assert "Traceback" not in err and "graceful shutdown exceeded" not in err, err
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
