"""Every install hint the code prints says how this project is installed (from a
clone of its repository), never the public index's name, which is another,
older package."""

from __future__ import annotations

import re
from pathlib import Path

from pg_scheduler.support.install import install_hint

ROOT = Path(__file__).resolve().parents[2]
# ``pip install`` followed by the distribution's name, bare or with extras.
BY_INDEX_NAME = re.compile(r"pip install\s+['\"]?pg[-_]scheduler\b(?!\S*\s*@)", re.IGNORECASE)


def test_no_hint_installs_the_index_name() -> None:
    found = []
    for folder in ("pg_scheduler", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if BY_INDEX_NAME.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_the_hint_installs_from_a_clone() -> None:
    hint = install_hint("embedded")
    assert "pip install -e '.[embedded]'" in hint and "clone" in hint
    assert not BY_INDEX_NAME.search(hint)


def test_the_pattern_catches_what_it_is_for() -> None:
    assert BY_INDEX_NAME.search("pip install 'pg-scheduler[embedded]'")
    assert BY_INDEX_NAME.search("pip install pg-scheduler")
    assert not BY_INDEX_NAME.search("pip install 'pg_scheduler[embedded] @ git+https://x/y'")
