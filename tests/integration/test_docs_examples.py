"""Every ``python`` block of README.md and docs/ runs, page by page, against real
PostgreSQL (tests/support/docs_runner.py says how a page's blocks run)."""

from __future__ import annotations

import asyncio
import sys
import uuid

import asyncpg
import pytest

from tests.support.common import ROOT, child_env, with_database
from tests.support.docs_runner import blocks

PAGES = sorted(
    path
    for path in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    if blocks(path.read_text())
)


def test_the_pages_have_examples() -> None:
    assert ROOT / "README.md" in PAGES and len(PAGES) > 10


def test_skipped_blocks_say_why() -> None:
    for page in PAGES:
        for block in blocks(page.read_text()):
            assert block.skip is None or len(block.skip) > 10, f"{page}:{block.line}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
async def test_every_python_block_runs(page, server_dsn) -> None:
    name = f"pgs_docs_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.docs_runner",
            str(page),
            env=child_env(with_database(server_dsn, name)),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), 110)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 0, out.decode()[-2000:] + err.decode()[-6000:]
    finally:
        admin = await asyncpg.connect(server_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
