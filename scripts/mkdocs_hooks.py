"""MkDocs hooks for this site (``hooks:`` in mkdocs.yml).

The package's docstrings name objects with Sphinx roles (``:meth:`start```),
which mkdocstrings shows as written; the page keeps the code, without the role.
"""

from __future__ import annotations

import re
from typing import Any

SPHINX_ROLE = re.compile(r":(?:py:)?(?:meth|class|attr|func|mod|exc|data|obj):(?=<code>)")


def on_page_content(html: str, **_: Any) -> str:
    return SPHINX_ROLE.sub("", html)
