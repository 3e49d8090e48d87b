"""Run the ``python`` code blocks of one Markdown page, in order, as a reader would.

``python -m tests.support.docs_runner PAGE.md`` with ``PG_SCHEDULER_DSN`` set to a
migrated database: exits 0 when every block ran, else prints the failing block's
line and traceback and exits 1. ``tests/integration/test_docs_examples.py`` runs it
once per page, each page in a process and a database of its own (tasks and
``@periodic`` jobs register process-wide).

The blocks of one page share one namespace, a module named after the page (so
task names are ``docs_<page>:<function>``). Top-level ``await`` works. Before the
first block the namespace holds what the pages take as given:

- ``dsn``: the database (also ``$PG_SCHEDULER_DSN``);
- ``pool``: an asyncpg pool on it;
- ``scheduler``: a started Scheduler on that pool, with test-speed timings;
- ``now``: ``datetime.now(UTC)`` when the page started.

A block that defines ``test_*`` functions (an example test file) has them run
after it, in order, as pytest would. ``pg_scheduler.testing`` makes its
throwaway databases on the page's server instead of starting another one.
A block that cannot run is preceded by ``<!-- docs: skip (the reason) -->``.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import sys
import traceback
import types
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"<!--\s*docs:\s*skip\s*\((.+?)\)\s*-->\s*$")


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    code: str
    skip: str | None  # the reason, for a block marked to skip


def blocks(text: str) -> list[Block]:
    """Every ```python block of ``text``, with its skip mark."""
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = SKIP.search(before)
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(line, match.group(1), mark.group(1) if mark else None))
    return found


def module_name(page: Path) -> str:
    return "docs_" + re.sub(r"\W", "_", page.stem.lower())


async def _given(dsn: str) -> dict[str, object]:
    import asyncpg

    from pg_scheduler import Scheduler, testing
    from pg_scheduler.testing import TEST_SETTINGS

    testing._embedded_dsn = lambda: dsn  # type: ignore[attr-defined]
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=10)
    settings = {**TEST_SETTINGS, "shutdown_grace_period": 1.0, "run_periodic_jobs": True}
    scheduler = Scheduler(pool, **settings)
    await scheduler.start()
    return {"dsn": dsn, "pool": pool, "scheduler": scheduler, "now": datetime.now(UTC)}


async def _close(given: dict[str, object]) -> None:
    await given["scheduler"].shutdown(grace_period=1.0)  # type: ignore[attr-defined]
    await given["pool"].close()  # type: ignore[attr-defined]


async def _run(code: types.CodeType, namespace: dict[str, object]) -> None:
    result = eval(code, namespace)
    if asyncio.iscoroutine(result):
        await result


def run_page(page: Path) -> int:
    dsn = os.environ["PG_SCHEDULER_DSN"]
    page_blocks = blocks(page.read_text())
    module = types.ModuleType(module_name(page))
    module.__file__ = str(page)
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    given = loop.run_until_complete(_given(dsn))
    namespace.update(given)
    failed = 0
    try:
        for block in page_blocks:
            if block.skip:
                print(f"{page}:{block.line}: skipped ({block.skip})")
                continue
            try:
                code = compile(
                    block.code,
                    f"{page}:{block.line}",
                    "exec",
                    flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
                )
                before = set(namespace)
                if "asyncio.run(" in block.code:  # a whole script: it runs its own loop
                    eval(code, namespace)
                    asyncio.set_event_loop(loop)  # asyncio.run() unsets it
                else:  # on the page's loop, as code in an async application runs
                    loop.run_until_complete(asyncio.wait_for(_run(code, namespace), 60))
                new = [n for n in namespace if n not in before and n.startswith("test_")]
                for name in [n for n in new if inspect.isfunction(namespace[n])]:
                    outcome = namespace[name]()
                    if asyncio.iscoroutine(outcome):
                        loop.run_until_complete(asyncio.wait_for(outcome, 60))
                    print(f"{page}:{block.line}: {name} passed")
            except BaseException:
                failed += 1
                print(f"{page}:{block.line}: the block failed", file=sys.stderr)
                traceback.print_exc()
                break  # later blocks build on this one
            print(f"{page}:{block.line}: ran")
    finally:
        loop.run_until_complete(_close(given))
        loop.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_page(Path(sys.argv[1])))
