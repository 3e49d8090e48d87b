"""The documentation site covers what it says it covers (mkdocs build --strict,
run in CI, checks its links, pages and references)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import yaml

import pg_scheduler
from pg_scheduler import Scheduler

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_api_page_documents_every_public_name() -> None:
    documented = re.findall(r"^::: pg_scheduler\.(\w+)$", (DOCS / "api.md").read_text(), re.M)
    assert sorted(documented) == sorted(pg_scheduler.__all__)
    assert "::: pg_scheduler.testing" in (DOCS / "api-testing.md").read_text()


def test_the_configuration_page_lists_every_scheduler_keyword() -> None:
    page = (DOCS / "configuration.md").read_text()
    block = page.split("configured = Scheduler(", 1)[1].split("\n)\n", 1)[0]
    listed = re.findall(r"^    (\w+)=", block, re.M)
    keywords = [name for name in inspect.signature(Scheduler).parameters if name != "db_pool"]
    assert listed == keywords


def test_the_nav_has_every_page_once() -> None:
    config = yaml.safe_load((DOCS.parent / "mkdocs.yml").read_text())

    def pages(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [page for item in node for page in pages(item)]
        if isinstance(node, dict):
            return [page for value in node.values() for page in pages(value)]
        return []

    in_nav = pages(config["nav"])
    assert sorted(in_nav) == sorted(p.name for p in DOCS.glob("*.md"))
    for section in ("Tutorial", "How-to guides", "Reference", "Explanation"):
        assert any(section in item for item in config["nav"] if isinstance(item, dict))
