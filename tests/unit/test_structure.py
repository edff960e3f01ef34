"""The shape of the code, checked: no import cycle between the package's modules, no module past
450 lines, and a server that uses only the library's public names.

Imports are read with ``ast`` from the source, so the check sees what a reader sees. Module-level
imports and those under ``if TYPE_CHECKING`` count (an annotation that needs a cycle is a cycle of
concepts); an import inside a function is a deliberate lazy import (optional packages, the CLI's
commands) and is left out, as Python's own cycle rules leave it out.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("registry", "server")
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _top_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements run when the module is imported (function bodies excluded)."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.ClassDef):
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom,
              known: dict[str, Path]) -> Iterator[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for one statement, absolute names."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, None
        return
    if node.level:
        base = module.split(".")
        if path.name != "__init__.py":
            base = base[:-1]
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        yield (sub, None) if sub in known else (target, alias.name)


def _graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in _top_level_imports(tree):
            for target, _ in _imported(module, path, node, known):
                while target and target not in known:  # registry.store.s3.X -> registry.store.s3
                    target = target.rpartition(".")[0]
                if target and target != module and not module.startswith(target + "."):
                    graph[module].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_in_a_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle() -> None:
    """The check above is not vacuous: a planted cycle is found, and the graph is the real one."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    graph = _graph()
    assert "registry.errors" in graph["registry.refs"]
    assert "registry.backends" in graph["server.app"]


@pytest.mark.parametrize("module", sorted(_modules()))
def test_no_module_is_longer_than_450_lines(module: str) -> None:
    lines = _modules()[module].read_text().count("\n")
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it by concept"


def test_the_server_uses_only_public_names_of_the_library() -> None:
    known = _modules()
    private = []
    for module, path in known.items():
        if not module.startswith("server"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target, name in _imported(module, path, node, known):
                if not target.startswith("registry"):
                    continue
                parts = target.split(".") + ([name] if name else [])
                if any(p.startswith("_") for p in parts):
                    private.append(f"{module}: {target}{'.' + name if name else ''}")
    assert not private, private
