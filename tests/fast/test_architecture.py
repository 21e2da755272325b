"""The shape of gradguard's import graph: no import circle, and a core that imports only itself.

Why: a circle makes import order matter (a module sees its partner half-initialised) and makes "which layer is
this?" unanswerable; the usual way around one, an import moved into a function, hides the circle without
removing it. So the graph here is read from the source with ``ast`` (nothing is imported: no framework needed,
and an import that would fail still counts), and every ``import`` and ``from ... import`` of a gradguard module
is an edge, at module level or inside a function alike. A circle is broken by moving the shared piece into a
module both sides import, or by passing a function or value in. Imports under ``if TYPE_CHECKING:`` are not
edges: they are never executed (annotations only, for mypy).
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = "gradguard"
SRC = pathlib.Path(__file__).resolve().parents[2] / "src"


def _modules(src: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """Dotted name -> file of every module under ``src/package`` (a package is named by its ``__init__.py``)."""
    modules = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _absolute(module: str, path: pathlib.Path, level: int, name: str | None) -> str:
    """The absolute module a ``from`` import names: ``from ..x import y`` inside ``gradguard.a.b`` is ``gradguard.x``
    (a package's ``__init__.py`` counts as inside the package)."""
    if not level:
        return name or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _is_type_checking_block(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(src: pathlib.Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, anywhere in its file. ``from pkg import name`` is an edge
    to ``pkg.name`` when that is a module, else to ``pkg``."""
    modules = _modules(src, package)
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        typing_only = {id(inner) for node in ast.walk(tree) if _is_type_checking_block(node)
                       for child in node.body for inner in ast.walk(child)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                graph[module].update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(module, path, node.level, node.module)
                if target != package and not target.startswith(package + "."):
                    continue
                for alias in node.names:
                    if f"{target}.{alias.name}" in modules:
                        graph[module].add(f"{target}.{alias.name}")
                    elif target in modules:
                        graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def test_circles_finds_a_circle_and_only_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": set()}
    assert circles(graph) == [["a", "b", "c"], ["d", "e"]]


def test_the_graph_reads_every_kind_of_import(tmp_path):
    files = {
        "pkg/__init__.py": "from . import a\nfrom ._v import v\n",
        "pkg/_v.py": "import os\nv = 1\n",
        "pkg/a.py": "import pkg.sub.b\nfrom pkg import _v\n",
        "pkg/sub/__init__.py": "from .b import name\nfrom .. import v\n",
        "pkg/sub/b.py": "def later():\n    from ..a import thing\n    from . import c\n    import json\n",
        "pkg/sub/c.py": "from pkg.sub import name\n",
        "other/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert import_graph(tmp_path, "pkg") == {
        "pkg": {"pkg.a", "pkg._v"},  # from . import a (a module); from ._v import v (a name of one)
        "pkg._v": set(),  # the standard library is no edge
        "pkg.a": {"pkg.sub.b", "pkg._v"},  # absolute imports
        "pkg.sub": {"pkg.sub.b", "pkg"},  # relative from a package's __init__; a name of the package
        "pkg.sub.b": {"pkg.a", "pkg.sub.c"},  # inside a function, relative from a module
        "pkg.sub.c": {"pkg.sub"},  # a name the package defines is an edge to the package
    }


def test_no_import_circle():
    """Every circle is listed: its modules, and each import that runs between two of them."""
    graph = import_graph()
    found = circles(graph)
    lines = []
    for component in found:
        members = set(component)
        lines.append("circle: " + ", ".join(component))
        lines += [f"    {module} -> {target}" for module in component for target in sorted(graph[module] & members)]
    assert not found, "import circles in src/gradguard:\n" + "\n".join(lines)


def test_core_imports_nothing_outside_core():
    """gradguard.core is the bottom layer: no framework adapter, renderer, error class or CLI above it."""
    graph = import_graph()
    core = "gradguard.core"
    inside = {module for module in graph if module == core or module.startswith(core + ".")}
    offenders = sorted(f"{module} -> {target}" for module in inside for target in graph[module] - inside)
    assert offenders == []
