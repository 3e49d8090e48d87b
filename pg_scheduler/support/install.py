"""How to install one of the package's optional extras, said once.

The project is installed from a clone of its repository; the name on the
public package index belongs to an unrelated, older release, so no hint may
point there.
"""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """The command that adds ``extra`` (``embedded``, ``dashboard``, ...)."""
    return f"pip install -e '.[{extra}]' in a clone of the pg_scheduler repository"
