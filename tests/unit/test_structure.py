"""The shape of the code, checked: no import cycle between the package's modules, no import of
the package's own modules hidden inside a function unless listed below, no private name used
across modules, no module past 450 lines, a facade (``registry/client.py``) that only delegates
and inherits from nothing, and a server that uses only the library's public names.

Imports are read with ``ast`` from the source, so the checks see what a reader sees.

- **Cycles** are computed over *every* import between the package's own modules: module-level,
  under ``if TYPE_CHECKING`` (an annotation that needs a cycle is a cycle of concepts) and inside
  functions (an import placed in a function to dodge Python's cycle rules is still a cycle: the
  two modules cannot be understood, tested or moved apart).
- **Function-level imports** of the package's own modules (``from .x import y`` in a function,
  or ``importlib.import_module``) are allowed only where :data:`LAZY_OWN_IMPORTS` lists them
  with the reason; the test asserts the exact multiset, so a new one fails until it is listed
  and explained. Lazy imports of third-party packages (torch, onnx, transformers, boto3...) are
  not counted: keeping ``import registry`` and the catalog commands of the CLI free of them is
  what lazy imports are for.
- **Private names** (``_x``; ``__dunder__`` names are public protocol) are a module's own.
  Counted as a reach: ``from .m import _x``, ``m._x`` on an imported module, and ``obj._x`` on
  any object when ``_x`` is defined by another of the package's modules and not by this one
  (``catalog._session`` in a module that merely receives the catalog). ``self._x`` and
  ``cls._x`` are the object's own names, even when a base class in another module defines them:
  a class and its bases are one object. Attributes of third-party
  objects (torch's ``module._parameters``) are not the package's names and are not counted.
  Modules whose *file name* is private (``registry/_api.py``, ``registry/_progress.py``,
  ``registry/cli/_context.py``) are private to the package, not to themselves: a sibling
  module of the package may import their (public) names; the server may not (last test), since to
  it the whole of ``registry`` is a library with a public surface.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("registry", "server")
MAX_LINES = 450
FACADE, FACADE_CLASS = "registry.client", "Registry"
# What one method of the facade may hold: a delegation (a call or two, a branch to an OCI door),
# never a loop, a try or a step of its own.
FACADE_MAX_STATEMENTS = 4

# Every function-level import of an own module: (importing module, imported module) -> (how
# many import statements, why). "<dynamic>" is importlib.import_module of an own module.
LAZY_OWN_IMPORTS: dict[tuple[str, str], tuple[int, str]] = {
    # `import registry` stays torch-free: the names that need torch load on first use (PEP 562).
    ("registry", "<dynamic>"): (1, "registry/__init__ __getattr__, the PEP 562 lazy names"),
    # The CLI's catalog commands (ls, show, alias, tag, rm, gc, token, db, store) never import
    # torch (tests/integration/test_cli_without_torch.py): each command that needs torch, the
    # catalog's SQL engine, the server or MLflow imports it itself.
    ("registry.cli._context", "registry.client"): (1, "open_registry: Registry needs torch"),
    ("registry.cli.models", "registry.io.weights"): (1, "pull -o x.safetensors needs torch"),
    ("registry.cli.models", "registry.io.checkpoints"): (1, "the same command (torch)"),
    ("registry.cli.models", "registry.oci.door"): (1, "pull oci:// pins its tag (httpx, torch)"),
    ("registry.cli.exports", "registry.exports.service"): (1, "export needs torch"),
    ("registry.cli.exports", "registry.exports.common"): (1, "--input-shape parsing (torch)"),
    ("registry.cli.admin", "registry.catalog.db"): (3, "db upgrade/downgrade/current: alembic"),
    ("registry.cli.service", "server.app"): (1, "serve: fastapi, uvicorn"),
    ("registry.cli.service", "server.auth"): (4, "serve, token create/revoke/ls: the server's"),
    ("registry.cli.service", "registry.mirror.mirror_mlflow"): (2, "sync, ui: the MLflow mirror"),
    # The catalog's ORM (sqlalchemy) stays out of `import registry` and of a remote `ls`;
    # publish.reconcile runs only where a local catalog is open.
    ("registry.publish", "registry.catalog.models"): (1, "the READY / DELETED row states"),
    # Every Registry imports backends, a remote one too: the SQL catalog loads only when
    # from_settings opens a local one, so a client of a server never imports sqlalchemy.
    ("registry.backends", "registry.catalog.repository"): (1, "from_settings: a local catalog"),
    # The server serves the Hub door without torch; a derived revision (a dtype variant, a
    # torchao or adapter directory) is written by save_pretrained's writer, loaded on first use.
    ("registry.doors.hf", "registry.doors.hfderive"): (1, "a derived revision needs torch"),
    # numba loads (0.5-0.8 s) only once a process's diffs have compared 2 Gi elements.
    ("registry.provenance.deltas", "registry.provenance.kernel"): (1, "the diff's numba pass"),
}


@dataclass(frozen=True)
class Source:
    text: str
    is_package: bool = False  # an __init__.py: relative imports start at the module itself


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _sources() -> dict[str, Source]:
    return {m: Source(p.read_text(), p.name == "__init__.py") for m, p in _modules().items()}


# -- reading imports ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Import:
    target: str         # an own module, "<dynamic>", or a third-party name
    name: str | None    # the name taken from it (from X import name), else None
    in_function: bool
    line: int = 0


def _own(target: str, known: dict[str, Source]) -> str | None:
    """The own module ``target`` names (registry.store.s3.X -> registry.store.s3), or None."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def _absolute(module: str, source: Source, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not source.is_package:
        base = base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports_own_by_name(node: ast.AST) -> bool:
    """``importlib.import_module`` of an own module: a name anchored at ``__name__`` or
    ``__package__``, or spelled relative or under a package of ours. (Third-party names computed
    at run time, a factory's module, are not own imports.)"""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if not ((isinstance(func, ast.Attribute) and func.attr == "import_module")
            or (isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))):
        return False
    anchored = any(isinstance(n, ast.Name) and n.id in ("__name__", "__package__")
                   for arg in node.args for n in ast.walk(arg))
    first = node.args[0] if node.args else None
    spelled = isinstance(first, ast.Constant) and isinstance(first.value, str) \
        and first.value.startswith((".", *(f"{p}." for p in PACKAGES)))
    return anchored or spelled


def _walk(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef
                                           | ast.Lambda)
        yield child, inside
        yield from _walk(child, inside)


def imports(module: str, known: dict[str, Source]) -> list[Import]:
    """Every import in ``module``: module level, under TYPE_CHECKING, and inside functions."""
    source = known[module]
    found: list[Import] = []
    for node, in_function in _walk(ast.parse(source.text)):
        if isinstance(node, ast.Import):
            found += [Import(a.name, None, in_function, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, source, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append(Import(sub, None, in_function, node.lineno) if sub in known
                             else Import(target, alias.name, in_function, node.lineno))
        elif _imports_own_by_name(node):
            found.append(Import("<dynamic>", None, in_function, node.lineno))
    return found


def graph(known: dict[str, Source]) -> dict[str, set[str]]:
    """module -> the own modules it imports, by any import (parents of a module excluded:
    importing ``registry.store.s3`` runs ``registry/store/__init__`` by Python's rules)."""
    edges: dict[str, set[str]] = {name: set() for name in known}
    for module in known:
        for imp in imports(module, known):
            target = _own(imp.target, known)
            if target and target != module and not module.startswith(target + "."):
                edges[module].add(target)
    return edges


def lazy_own_imports(known: dict[str, Source]) -> Counter[tuple[str, str]]:
    """(module, own module) -> how many import statements inside functions import it."""
    found: set[tuple[str, str, int]] = set()
    for module in known:
        for imp in imports(module, known):
            target = imp.target if imp.target == "<dynamic>" else _own(imp.target, known)
            if imp.in_function and target:
                found.add((module, target, imp.line))
    return Counter((module, target) for module, target, _line in found)


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


# -- private names ---------------------------------------------------------------------------

def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def defined(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, names bound in it, and the
    attributes it sets on ``self`` / ``cls`` (not those it sets on others' objects)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and _self(node.value):
            names.add(node.attr)
    return {n for n in names if _private(n)}


def private_reaches(known: dict[str, Source]) -> list[str]:
    """``"module: what"`` for each use of another module's private name."""
    trees = {m: ast.parse(s.text) for m, s in known.items()}
    own = {m: defined(t) for m, t in trees.items()}
    found: list[str] = []
    for module, tree in trees.items():
        others = set().union(*(names for m, names in own.items() if m != module))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _absolute(module, known[module], node)
                if _own(target, known):
                    found += [f"{module}: {target}.{a.name}" for a in node.names
                              if _private(a.name) and f"{target}.{a.name}" not in known]
            elif isinstance(node, ast.Attribute) and _private(node.attr) \
                    and not _self(node.value) and node.attr not in own[module] \
                    and node.attr in others:
                found.append(f"{module}: {ast.unparse(node)}")
    return sorted(set(found))


# -- the checks --------------------------------------------------------------------------------

def test_no_module_imports_in_a_cycle() -> None:
    known = _sources()
    found = cycle(graph(known))
    assert found is None, "import cycle: " + " -> ".join(found or [])


def test_own_modules_are_imported_inside_functions_only_where_listed() -> None:
    found = lazy_own_imports(_sources())
    expected = Counter({key: count for key, (count, _why) in LAZY_OWN_IMPORTS.items()})
    assert +found == expected, (
        "function-level imports of own modules changed; import at module level, or list the "
        f"import with its reason in LAZY_OWN_IMPORTS. Now: {dict(+found)}")


def test_no_private_name_is_used_across_modules() -> None:
    found = private_reaches(_sources())
    assert not found, found


@pytest.mark.parametrize("module", sorted(_modules()))
def test_no_module_is_longer_than_450_lines(module: str) -> None:
    lines = _modules()[module].read_text().count("\n")
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it by concept"


def test_the_facade_only_delegates() -> None:
    """client.py is the Registry's calls into its collaborators and the pipelines, not a
    pipeline itself: each method a few statements, no loop, no try."""
    assert {"registry.pipelines.pull", "registry.pipelines.push"} <= graph(_sources())[FACADE]
    tree = ast.parse(_modules()[FACADE].read_text())
    facade = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == FACADE_CLASS)
    too_much = [m for m in facade.body if isinstance(m, ast.FunctionDef) and not _delegates(m)]
    assert not too_much, [f"{m.name} (line {m.lineno})" for m in too_much]


def _delegates(method: ast.FunctionDef) -> bool:
    body = method.body[1:] if ast.get_docstring(method) is not None else method.body
    statements = [n for n in ast.walk(ast.Module(body=body, type_ignores=[]))
                  if isinstance(n, ast.stmt)]
    loops = (ast.For, ast.While, ast.Try, ast.FunctionDef, ast.ClassDef)
    return len(statements) <= FACADE_MAX_STATEMENTS and not any(
        isinstance(n, loops) for n in statements)


def test_the_facade_composes_and_inherits_from_nothing() -> None:
    """Registry holds its collaborators (catalog operations, signing, the backend) as fields
    and delegates; no concern reaches push through a base class (issue #47)."""
    tree = ast.parse(_modules()[FACADE].read_text())
    facade = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == FACADE_CLASS)
    bases = [ast.unparse(b) for b in facade.bases]
    assert all(b in ("object", "Protocol", "typing.Protocol") for b in bases), bases
    from registry.client import Registry

    assert Registry.__mro__[1:] == (object,)


FORMATS_TABLE = "registry.formats.table"
FORMATS_SHARED = ("registry.formats.base", "registry.formats.common")


def format_modules(known: dict[str, Source]) -> set[str]:
    """The format modules: those of ``registry/formats/`` the table imports, besides the
    interface and the shared helpers."""
    return {m for m in graph(known)[FORMATS_TABLE]
            if m.startswith("registry.formats.") and m not in FORMATS_SHARED}


def format_reaches(known: dict[str, Source]) -> list[str]:
    """``"module imports format"`` for each module besides the table that imports a format."""
    formats = format_modules(known)
    return sorted(f"{m} imports {t}" for m, targets in graph(known).items()
                  if m != FORMATS_TABLE for t in targets & formats)


def test_no_module_but_the_formats_table_imports_a_format_module() -> None:
    """A format is one module plus a line in the table: push and pull reach it only through
    ``registry/formats/table.py``, never by importing it."""
    known = _sources()
    assert {"registry.formats.floats", "registry.formats.torchao"} <= format_modules(known)
    assert not format_reaches(known), format_reaches(known)
    planted = {**known, "registry.planted": Source("from .formats.torchao import flatten\n")}
    assert format_reaches(planted) == ["registry.planted imports registry.formats.torchao"]


def test_the_server_uses_only_public_names_of_the_library() -> None:
    known = _sources()
    private = []
    for module in known:
        if not module.startswith("server"):
            continue
        for imp in imports(module, known):
            if not imp.target.startswith("registry"):
                continue
            parts = imp.target.split(".") + ([imp.name] if imp.name else [])
            if any(p.startswith("_") for p in parts):
                private.append(f"{module}: {imp.target}{'.' + imp.name if imp.name else ''}")
    assert not private, private


# -- the checkers themselves, on planted violations -----------------------------------------------

PLANTED = {
    "pkg": Source("import importlib\n\ndef __getattr__(n):\n"
                  "    return importlib.import_module('.a', __name__)\n", is_package=True),
    "pkg.a": Source("from . import b\nfrom .b import _hidden\n\nX = b._helper()\n"),
    "pkg.b": Source("import torch\n\ndef _helper():\n    import onnx\n    from .c import Y\n"
                    "    return Y\n\n_hidden = 1\n"),
    "pkg.c": Source("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from .a import X\n\nclass C:\n    def __init__(self, store):\n"
                    "        self._own = store._session()\n        store._metadata = 1\n"
                    "        torch_module._parameters.clear()\n"),
    "pkg.d": Source("def f(catalog):\n    return catalog._own\n"),
}


def test_the_checks_find_planted_violations() -> None:
    edges = graph(PLANTED)
    # pkg.b's function-level import of pkg.c closes a cycle through pkg.c's TYPE_CHECKING import.
    assert edges["pkg.b"] == {"pkg.c"} and edges["pkg.c"] == {"pkg.a"}
    assert cycle(edges) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
    # onnx (third-party) is not counted; the computed import of pkg/__init__ is.
    assert lazy_own_imports(PLANTED) == Counter({("pkg.b", "pkg.c"): 1,
                                                 ("pkg", "<dynamic>"): 1})
    # store._session: defined by no own module (third-party); store._metadata: set on another's
    # object is no definition; self._own is pkg.c's own, but pkg.d reaches it on another object.
    assert private_reaches(PLANTED) == ["pkg.a: b._helper", "pkg.a: pkg.b._hidden",
                                        "pkg.d: catalog._own"]


def test_the_checks_read_the_real_code() -> None:
    known = _sources()
    edges = graph(known)
    assert "registry.errors" in edges["registry.refs"]
    assert "registry.backends" in edges["server.app"]
    assert lazy_own_imports(known)[("registry.cli._context", "registry.client")] == 1
