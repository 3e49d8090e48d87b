"""Shared by the dashboard tests: a real HTTP server in the test's loop, and a
minimal WebDriver client (raw HTTP to chromedriver, no selenium)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

CHROMIUM = os.environ.get("PG_SCHEDULER_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = (
    os.environ.get("PG_SCHEDULER_CHROMEDRIVER")
    or shutil.which("chromedriver")
    or ("/usr/bin/chromedriver")
)


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if not os.access(CHROMEDRIVER, os.X_OK):
        return f"no chromedriver at {CHROMEDRIVER} (apt-get install chromium-driver)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 from this event loop; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not server.started:
        if task.done():
            task.result()
        if loop.time() > deadline:
            raise AssertionError("the dashboard server did not start")
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        server.force_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)


class Browser:
    """One headless Chromium session through chromedriver's W3C WebDriver API."""

    def __init__(self, http: httpx.AsyncClient, session_id: str) -> None:
        self.http = http
        self.session = session_id

    async def command(self, method: str, path: str, payload: Any = None) -> Any:
        response = await self.http.request(
            method, f"/session/{self.session}{path}", json=payload, timeout=60
        )
        data = response.json()
        if response.status_code != 200:
            raise AssertionError(f"WebDriver {method} {path}: {data}")
        return data.get("value")

    async def open(self, url: str) -> None:
        await self.command("POST", "/url", {"url": url})

    async def js(self, script: str, *args: Any) -> Any:
        return await self.command("POST", "/execute/sync", {"script": script, "args": list(args)})

    async def text(self, selector: str) -> str | None:
        return await self.js(
            "const n = document.querySelector(arguments[0]); return n ? n.textContent : null;",
            selector,
        )

    async def click(self, selector: str) -> None:
        found = await self.js(
            "const n = document.querySelector(arguments[0]); if (n) n.click(); return !!n;",
            selector,
        )
        assert found, f"nothing matches {selector!r}"

    async def screenshot(self, path: Path) -> None:
        data = await self.command("GET", "/screenshot")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(data))


@contextlib.asynccontextmanager
async def chromium(width: int = 1400, height: int = 1000) -> AsyncIterator[Browser]:
    """Start chromedriver and one headless Chromium; both end with the block."""
    port = free_port()
    driver = await asyncio.create_subprocess_exec(
        CHROMEDRIVER, f"--port={port}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while True:
                try:
                    if (await http.get("/status")).json()["value"]["ready"]:
                        break
                except httpx.HTTPError:
                    pass
                if loop.time() > deadline:
                    raise AssertionError("chromedriver did not become ready")
                await asyncio.sleep(0.05)
            args = [
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                f"--window-size={width},{height}",
            ]
            capabilities = {
                "capabilities": {
                    "alwaysMatch": {
                        "browserName": "chrome",
                        "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
                    }
                }
            }
            response = await http.post("/session", json=capabilities, timeout=60)
            session_id = response.json()["value"]["sessionId"]
            browser = Browser(http, session_id)
            try:
                yield browser
            finally:
                with contextlib.suppress(httpx.HTTPError):
                    await http.delete(f"/session/{session_id}", timeout=30)
    finally:
        driver.terminate()
        try:
            await asyncio.wait_for(driver.wait(), 10)
        except TimeoutError:
            driver.kill()
            await driver.wait()
