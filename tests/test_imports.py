"""The import map of ``src/linattn``: no circle, no reach into another package's private modules.

The graph is read from the source with ``ast`` (nothing is imported): one node per module, one edge
per ``import`` or ``from ... import`` of a ``linattn`` module, wherever it is written (top level,
inside a function, under ``TYPE_CHECKING``). ``from linattn.p import name`` is an edge to the module
``linattn.p.name`` when that file exists, else to the package ``linattn.p``. Importing a submodule
does not count as importing its parent packages' ``__init__`` (every package would then be a circle
with its own submodules).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import linattn

ROOT = Path(linattn.__file__).parent

# No module imports a private module of another package (the fused kernels' build and cache are
# public as ``linattn.ops.native``).
ALLOWED_PRIVATE: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    """``.../linattn/ops/chunk.py`` -> ``linattn.ops.chunk``; an ``__init__``: its package."""
    parts = ("linattn", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def resolve(importer: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import names (relative: against ``importer``)."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not is_package(importer):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported(importer: str, tree: ast.AST) -> tuple[set[str], set[str]]:
    """Every ``linattn`` module the source imports, and every private name (``_x``, not a module)
    it imports from one, as ``module._x``."""
    found, names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = resolve(importer, node)
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                found.add(candidate if candidate in MODULES else module)
                if candidate not in MODULES and alias.name.startswith("_") and module in MODULES:
                    names.add(candidate)
    return {name for name in found if name in MODULES}, names


def parsed(name: str) -> ast.AST:
    return ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))


def import_graph() -> dict[str, set[str]]:
    return {name: imported(name, parsed(name))[0] for name in MODULES}


def private_names() -> dict[str, set[str]]:
    """importer -> the private names it imports from ``linattn`` modules."""
    return {name: imported(name, parsed(name))[1] for name in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as a list of modules (first repeated last), or None (depth-first)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def owner(private: str) -> str | None:
    """The package a private module or name belongs to (``linattn.ops._checks`` and
    ``linattn.ops.chunk._terms`` -> ``linattn.ops``), or None for a public one."""
    parts = private.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            package = ".".join(parts[:i])
            return (
                package
                if package not in MODULES or is_package(package)
                else package.rpartition(".")[0]
            )
    return None


def private_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, private module) pairs whose importer lies outside the private module's package."""
    bad = set()
    for importer, targets in graph.items():
        for target in targets:
            package = owner(target)
            if package is not None and not (
                importer == package or importer.startswith(package + ".")
            ):
                bad.add((importer, target))
    return bad


def test_the_graph_reads_every_module_and_sees_known_edges():
    graph = import_graph()
    assert "linattn.ops.chunk" in graph and "linattn.experiments.report" in graph
    assert "linattn.ops.affine" in graph["linattn.ops"]  # from linattn.ops.affine import ...
    assert "linattn.ops.checks" in graph["linattn.ops.delta_rule"]  # from linattn.ops import ...
    assert "linattn.experiments._args" in graph["linattn.experiments.bench"]
    assert "linattn.ops" in graph["linattn.layers.delta"]  # from linattn import ops


def test_find_cycle_finds_a_circle_and_passes_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    "importer, target, private",
    [
        ("linattn.layers.delta", "linattn.ops._checks", True),
        ("linattn.ops.delta_rule", "linattn.ops._checks", False),
        ("linattn.experiments.mqar.cli", "linattn.experiments._args", False),
        ("linattn.experiments.table1", "linattn.reference._checks", True),
        ("linattn.ops.parallel", "linattn.ops.chunk._terms", False),  # a sibling's private name
        ("linattn.layers.delta", "linattn.ops.chunk._terms", True),
    ],
)
def test_private_imports_tells_inside_from_outside(importer, target, private):
    assert bool(private_imports({importer: {target}})) is private


def test_no_private_module_of_another_package_is_imported():
    bad = private_imports(import_graph()) - ALLOWED_PRIVATE
    assert not bad, "private modules imported from another package: " + ", ".join(
        f"{importer} imports {target}" for importer, target in sorted(bad)
    )


def test_no_private_name_of_another_package_is_imported():
    names = private_names()
    assert imported("linattn.x", ast.parse("from linattn.ops.chunk import _y"))[1] == {
        "linattn.ops.chunk._y"
    }
    bad = private_imports(names)
    assert not bad, "private names imported from another package: " + ", ".join(
        f"{importer} imports {target}" for importer, target in sorted(bad)
    )


def test_no_import_runs_from_the_library_up_into_the_experiments():
    graph = import_graph()
    above = ("linattn.experiments", "linattn.cli", "linattn.__main__")
    library = [name for name in graph if not name.startswith(above)]
    up = [(m, t) for m in library for t in graph[m] if t.startswith("linattn.experiments")]
    assert not up, f"library modules importing experiments: {up}"


def drawing_imports(tree: ast.AST) -> list[str]:
    """The matplotlib modules a source imports to draw (``matplotlib.pyplot``, ``.lines``, ...);
    a bare ``import matplotlib`` (a check that the optional extra is installed) is not one."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("matplotlib.")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("matplotlib"):
            found.append(node.module or "")
    return found


def test_only_the_figures_draw():
    """One plotting module: the commands draw their plots through ``linattn.figures``."""
    assert drawing_imports(ast.parse("import matplotlib.pyplot as plt")) == ["matplotlib.pyplot"]
    assert drawing_imports(ast.parse("import matplotlib")) == []
    drawing = {
        name: found
        for name in MODULES
        if not name.startswith("linattn.figures") and (found := drawing_imports(parsed(name)))
    }
    assert not drawing, f"modules drawing outside linattn.figures: {drawing}"
