"""Operations commands: status, jobs, retry, cancel, vacuum, periodic."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    """Add the operations subcommands (being built)."""
