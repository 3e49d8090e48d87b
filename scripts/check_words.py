"""The repository speaks of the product only: no account of how it was written.

``python scripts/check_words.py`` reads the tracked files of the product, its
docs, tests, benchmarks, examples and scripts, and exits 1 listing every line
that names a work period or a tracker ("sitting", "this session", "round 3",
"the ninth round", "issue 12") or tells history ("it used to", "not kept").
Product meanings are allowed: a database session (``SET SESSION``,
``session_user``, pgbouncer's session mode, a browser's session storage, ...).
Lines that must quote a word anyway end with ``words: ok``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ["pg_scheduler", "docs", "README.md", "benchmarks", "tests", "examples", "scripts"]
# This checker and its test spell the words out.
EXEMPT = {"scripts/check_words.py", "tests/unit/test_check_words.py"}

ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
    r"|\d+(?:st|nd|rd|th)"
)
FORBIDDEN = [
    ("a work period", re.compile(r"\bsittings?\b", re.I)),
    ("a work period", re.compile(r"\bthis session\b", re.I)),
    ("a work period", re.compile(rf"\b(?:{ORDINALS}) (?:round|sitting|session)s?\b", re.I)),
    ("a work period", re.compile(r"\bround (?:\d+|[ivx]+)\b", re.I)),
    ("a tracker's number", re.compile(r"\bissues? #?\d+", re.I)),
    ("history", re.compile(r"\bnot kept\b", re.I)),
    ("history", re.compile(r"\bit used to\b", re.I)),
]
# Product meanings of the same words, removed from a line before the check.
ALLOWED = re.compile(
    r"set session\b|session_user|session mode|session pool|pool_mode ?= ?session"
    r"|session storage|sessionstorage|database session|session-level|session lock"
    r"|its result was not kept",  # a row the vacuum deleted
    re.I,
)
MARK = "words: ok"


def tracked_files(root: Path = ROOT) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", *SCANNED],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [root / name for name in out.split("\0") if name and name not in EXEMPT]


def problems_in(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, the line) for each forbidden use in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.rstrip().endswith(MARK):
            continue
        cleaned = ALLOWED.sub(" ", line)
        for what, pattern in FORBIDDEN:
            if pattern.search(cleaned):
                found.append((number, what, line.strip()))
                break
    return found


def check(paths: list[Path], root: Path = ROOT) -> list[str]:
    report = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # images and other binaries; a file deleted but not staged
        for number, what, line in problems_in(text):
            report.append(f"{path.relative_to(root)}:{number}: {what}: {line}")
    return report


def main() -> int:
    report = check(tracked_files())
    for line in report:
        print(line)
    if report:
        print(f"{len(report)} line(s) speak of how the code was written, not of the product")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
