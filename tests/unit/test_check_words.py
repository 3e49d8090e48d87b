"""scripts/check_words.py: the repository speaks of the product only."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scripts.check_words import ROOT, check, problems_in, tracked_files


@pytest.mark.parametrize(
    "line",
    [
        "Measured in the third sitting on a shared machine.",
        "Fixed in this session, see the log.",
        "The ninth round cut the claim to one statement.",
        "Round 7 made the drain faster.",
        "See issue 12 for the reproduction.",
        "as issue #40 says",
        "A faster claim was tried and not kept.",
        "It used to return after the job's block.",
    ],
)
def test_history_words_are_found(line: str) -> None:
    assert [number for number, _, _ in problems_in(f"ok\n{line}\n")] == [2]


@pytest.mark.parametrize(
    "line",
    [
        "Each database session runs SET SESSION statement_timeout first.",
        "GRANT ... TO session_user; pgbouncer's session mode needs none of this.",
        "Session pooling (pool_mode = session) keeps every server connection.",
        "The token stays in the tab's session storage.",
        "A round trip per statement; the rescuer's next pass.",
        "An issue of the queue: 12 jobs waited.",
        "Quoting a forbidden word on purpose: it used to. words: ok",
    ],
)
def test_product_meanings_pass(line: str) -> None:
    assert problems_in(line) == []


def test_the_tracked_files_are_clean() -> None:
    files = tracked_files()
    assert any(path.name == "README.md" for path in files)
    assert check(files) == []


def test_the_command_fails_on_a_finding(tmp_path) -> None:
    bad = tmp_path / "notes.md"
    bad.write_text("This was measured in a sitting.\n")
    assert check([bad], root=tmp_path) == [f"notes.md:1: a work period: {bad.read_text().strip()}"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_words.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout
