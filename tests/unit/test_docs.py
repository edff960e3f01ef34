"""The README is a front page that points into the manual (docs/); what it points at must be
there, and what the manual shares with the code and the README must not drift.

``mkdocs build --strict`` (``make docs``, part of ``make test``) checks the links inside docs/;
these check what it cannot: the README's links, and the facts two places hold."""

from __future__ import annotations

import re
from pathlib import Path

import registry.settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def _anchors(markdown: str) -> set[str]:
    """The ids the Markdown toc (and GitHub) give the page's headings."""
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
        out.add(re.sub(r"\s+", "-", slug))
    return out


def _table_rows(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("| ")]


def test_every_link_of_the_readme_names_a_file_and_heading_that_exist() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README links to {link}, which is not a file"
        if anchor:
            assert anchor in _anchors(target.read_text()), f"README links to {link}: no heading"


def test_the_settings_page_has_a_row_for_every_variable_settings_reads() -> None:
    table = _table_rows(registry.settings.__doc__ or "")[1:]
    variables = {name for row in table for name in re.findall(r"\b[A-Z][A-Z0-9_]{3,}\b", row)}
    assert {"REGISTRY_HOME", "REGISTRY_STORE_URL", "REGISTRY_PUSH_LEASE"} <= variables
    rows = "\n".join(_table_rows((DOCS / "settings.md").read_text()))
    missing = sorted(name for name in variables if f"`{name}" not in rows
                     and f" {name}" not in rows and f"({name}" not in rows)
    assert not missing, f"docs/settings.md has no row naming {missing}"


def test_the_readme_and_the_performance_page_show_the_same_benchmark_table() -> None:
    def results(text: str) -> list[str]:
        return [row for row in _table_rows(text) if re.match(r"\| \d+ \|", row)]

    shown = results(README)
    assert len(shown) >= 10
    assert shown == results((DOCS / "performance.md").read_text())
