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


def _named_modules(markdown: str) -> set[str]:
    """Every backticked `x.py` or `dir/` in the first column of a module table, as a path."""
    named: set[str] = set()
    for row in _table_rows(markdown):
        first = row.split("|")[1]
        folder = "registry/"  # a bare name in a row takes the folder of the row's first name
        for name in re.findall(r"`([\w/]+(?:\.py|/))`", first):
            if name.startswith(("registry/", "server/")):
                folder = name[:name.rindex("/") + 1] if name.endswith(".py") else folder
            else:
                name = folder + name
            named.add(name)
    return named


def test_every_module_the_architecture_maps_name_exists() -> None:
    arch = README[README.index("## Architecture"):README.index("## Development")]
    page = (DOCS / "architecture.md").read_text()
    for name in sorted(_named_modules(arch) | _named_modules(page)):
        target = ROOT / name
        exists = target.is_dir() if name.endswith("/") else target.is_file()
        assert exists, f"an architecture map names {name}, which is not in the tree"


def test_the_architecture_page_names_every_module() -> None:
    named = _named_modules((DOCS / "architecture.md").read_text())
    missing = []
    for package in ("registry", "server"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            folders = {"/".join(rel.split("/")[:i]) + "/" for i in range(2, rel.count("/") + 1)}
            if rel not in named and not folders & named and not rel.endswith("/__init__.py"):
                missing.append(rel)
    assert not missing, f"docs/architecture.md has no row for {missing}"
