"""Where the module instance that wrote was built: ``net.gate.2`` -> the third argument of the
``nn.Sequential(...)`` assigned to ``self.gate``, and the statements that turned its ``inplace`` on later.

Used on error paths (a diagnosis, ``gradguard fix``), never per op.

# NOTE [Resolving the writing instance to its construction]
# The torch backend names the module that wrote by its path from the user's variable (``net.gate.2``). The last
# attribute of the path (``gate``) is looked up as an assignment (``self.gate = ...`` or ``gate = ...``) in the
# user's files; the indices after it select an argument of ``Sequential``/``ModuleList`` (a list literal or a
# comprehension's element counts too), and a call of a factory function defined in those files is followed into
# the function. Each construction of the writing class reached that way is a site; when the path leads nowhere
# (an ``OrderedDict``, a list built by appends), every construction of the class with inplace=True in the files is a
# site, as before. A site is (line, occurrence): the occurrence counts the calls of the class in its statement,
# in source order, as ``gradguard fix``'s keyword edit counts them.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Iterator

from .findings import SourceLocation
from .fixes import keyword_calls
from .frames import user_frames
from .source_ast import COMPOUND, parse_file, statement_at

__all__ = ["ModuleSite", "instance_sites", "inplace_switches", "split_module_via", "writer_sites",
           "inplace_position", "constructed_in_place"]

_CONTAINERS = ("Sequential", "ModuleList")


@dataclass(frozen=True)
class ModuleSite:
    location: SourceLocation  # the line of the constructor call
    occurrence: int | None  # which call of the class in its statement (None: the only one)
    statement_line: int


def split_module_via(via: str | None) -> tuple[str, str] | None:
    """``net.gate.2 (ReLU(inplace=True))`` -> ("net.gate.2", "ReLU"); ``ReLU(inplace=True)`` -> ("", "ReLU")."""
    if not via or "(inplace=True)" not in via:
        return None
    head, _, kind = via.rpartition(" (")
    kind = kind.rstrip(")") if head else via
    name = kind.split("(", 1)[0].strip()
    return (head.strip(), name) if name.isidentifier() else None


def _callee(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _preorder(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _preorder(child)


def _statements(tree: ast.AST) -> list[ast.stmt]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]


def _enclosing_statement(tree: ast.AST, node: ast.AST) -> ast.stmt | None:
    """The innermost simple statement containing ``node``."""
    best = None
    for stmt in _statements(tree):
        if isinstance(stmt, COMPOUND):
            continue
        if any(n is node for n in _preorder(stmt)):
            best = stmt
    return best


def _site(file: str, tree: ast.AST, call: ast.expr, kind: str | None) -> ModuleSite | None:
    stmt = _enclosing_statement(tree, call)
    if stmt is None:
        return None
    calls = [n for n in _preorder(stmt) if _callee(n) == kind]
    index = next(i for i, n in enumerate(calls) if n is call)
    code = linecache.getline(file, call.lineno).strip()
    return ModuleSite(SourceLocation(file, call.lineno, "", code), index if len(calls) > 1 else None, stmt.lineno)


def _elements(expr: ast.expr) -> list[ast.expr] | None:
    """The positional modules of ``Sequential(a, b)``, ``ModuleList([a, b])``, ``Sequential(*[a, b])``; a
    comprehension gives its one element expression (every index selects it); None when not such a call."""
    if not isinstance(expr, ast.Call) or _callee(expr) not in _CONTAINERS:  # (_callee is None for any other node)
        return None
    args = list(expr.args)
    if len(args) == 1 and isinstance(args[0], ast.Starred):
        args = [args[0].value]
    if len(args) == 1 and isinstance(args[0], (ast.List, ast.Tuple)):
        return list(args[0].elts)
    if len(args) == 1 and isinstance(args[0], (ast.ListComp, ast.GeneratorExp)):
        return [args[0].elt]
    return None if any(isinstance(a, ast.Starred) for a in args) else args


def _select(expr: ast.expr, indices: list[int]) -> list[ast.expr]:
    for index in indices:
        elements = _elements(expr)
        if elements is None:
            return []
        # elements is not None: expr is an ast.Call (_elements)
        if len(elements) == 1 and isinstance(expr.args[-1] if expr.args else None,  # type: ignore[attr-defined]
                                             (ast.ListComp, ast.GeneratorExp)):
            expr = elements[0]
        elif 0 <= index < len(elements):
            expr = elements[index]
        else:
            return []
    return [expr]


def _functions(trees: dict[str, ast.Module]) -> dict[str, list[tuple[str, ast.AST]]]:
    found: dict[str, list[tuple[str, ast.AST]]] = {}
    for file, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.setdefault(node.name, []).append((file, node))
    return found


def _constructions(file: str, expr: ast.expr, kind: str, trees: dict[str, ast.Module],
                   functions: dict[str, list[tuple[str, ast.AST]]]) -> list[tuple[str, ast.Call]]:
    """The calls of ``kind`` that build ``expr``: itself, or the ones inside the factory function it calls."""
    # (the isinstance tests only say to the type checker what ``_callee(...) == kind`` implies)
    if isinstance(expr, ast.Call) and _callee(expr) == kind:
        return [(file, expr)]
    name = _callee(expr)
    return [(where, call) for where, function in functions.get(name or "", ())
            for call in _preorder(function) if isinstance(call, ast.Call) and _callee(call) == kind]


def _assignments(trees: dict[str, ast.Module], attribute: str) -> Iterator[tuple[str, ast.Module, ast.expr]]:
    """(file, tree, value) of each statement that assigns ``value`` to ``self.attribute`` (any receiver) or to the
    name ``attribute``."""
    for file, tree in trees.items():
        for stmt in _statements(tree):
            if isinstance(stmt, ast.Assign):
                targets, value = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                targets, value = [stmt.target], stmt.value
            else:
                continue
            if any((isinstance(t, ast.Attribute) and t.attr == attribute) or (isinstance(t, ast.Name) and t.id == attribute)
                   for t in targets):
                yield file, tree, value


def _split_path(path: str) -> tuple[str, list[int]] | None:
    parts = [p for p in path.split(".") if p]
    indices: list[int] = []
    while parts and parts[-1].isdigit():
        indices.insert(0, int(parts.pop()))
    return None if not parts or parts[-1] == "self" else (parts[-1], indices)


def instance_sites(files: list[str], path: str, kind: str) -> list[ModuleSite]:
    """Where the instance at ``path`` (``net.gate.2``) of class ``kind`` (``ReLU``) was constructed, searched in
    ``files``; empty when the path cannot be followed (see NOTE [Resolving the writing instance to its
    construction])."""
    split = _split_path(path)
    if split is None:
        return []
    attribute, indices = split
    trees = {f: t for f in dict.fromkeys(files) if (t := parse_file(f)) is not None}
    functions = _functions(trees)
    sites: list[ModuleSite] = []
    for file, _tree, value in _assignments(trees, attribute):
        for expr in _select(value, indices):
            for where, call in _constructions(file, expr, kind, trees, functions):
                site = _site(where, trees[where], call, kind)
                if site is not None and site not in sites:
                    sites.append(site)
    return sites


def inplace_switches(files: list[str], path: str) -> list[SourceLocation]:
    """Statements that turn a module's in-place mode on after it was built: ``X.inplace = True`` where ``X`` is
    the path's attribute (``self.drop`` for the path ``...drop``, ``self.body[2]`` for ``...body.2``; any ``X``
    when the path is unknown), a variable of a loop around the statement (``for m in self.modules():
    m.inplace = True``), or a name bound to that attribute (``drop = self.drop``)."""
    split = _split_path(path) if path else None
    found: list[SourceLocation] = []
    for file in dict.fromkeys(files):
        tree = parse_file(file)
        if tree is None:
            continue
        looped = _loop_bound(tree)
        aliases = {name for stmt in _statements(tree) for name, value in _aliases(stmt).items()
                   if split is not None and _refers_to(value, split)}
        for stmt in _statements(tree):
            if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and stmt.value.value is True):
                continue
            for target in stmt.targets:
                if not (isinstance(target, ast.Attribute) and target.attr == "inplace"):
                    continue
                owner = target.value
                if isinstance(owner, ast.Name):
                    named = split is None or owner.id in looped.get(id(stmt), ()) or owner.id in aliases
                else:
                    named = split is None or _refers_to(owner, split)
                if named:
                    code = linecache.getline(file, stmt.lineno).strip()
                    found.append(SourceLocation(file, stmt.lineno, "", code))
    return found


def _refers_to(expr: ast.expr, split: tuple[str, list[int]]) -> bool:
    """``self.drop`` / ``net.body[2]`` is the instance of the path split into (``drop``, []) / (``body``, [2])."""
    indices: list[int] = []
    while isinstance(expr, ast.Subscript):
        if not (isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, int)):
            return False
        indices.insert(0, expr.slice.value)
        expr = expr.value
    return isinstance(expr, ast.Attribute) and (expr.attr, indices) == split


def _aliases(stmt: ast.stmt) -> dict[str, ast.expr]:
    """``drop = self.drop`` -> {"drop": self.drop}."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return {stmt.targets[0].id: stmt.value}
    return {}


def _loop_bound(tree: ast.AST) -> dict[int, set[str]]:
    """For each statement inside a ``for`` loop (by id), the names the loops around it bind (``m``, and ``name``
    in ``for name, m in self.named_modules()``)."""
    bound: dict[int, set[str]] = {}
    for loop in ast.walk(tree):
        if not isinstance(loop, (ast.For, ast.AsyncFor)):
            continue
        names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
        for stmt in (n for body in (loop.body, loop.orelse) for s in body for n in ast.walk(s)):
            if isinstance(stmt, ast.stmt):
                bound.setdefault(id(stmt), set()).update(names)
    return bound


def constructed_in_place(site: ModuleSite, kind: str) -> bool:
    """Whether the call of ``kind`` at ``site`` passes inplace=True itself (``nn.ReLU(inplace=True)``,
    ``nn.Dropout(0.5, True)``): then the constructor is what made the module write in place."""
    stmt = statement_at(site.location.file, site.statement_line)
    calls = [n for n in _preorder(stmt) if isinstance(n, ast.Call) and _callee(n) == kind] if stmt else []
    call = calls[site.occurrence or 0] if len(calls) > (site.occurrence or 0) else None
    if call is None:
        return "inplace=True" in site.location.code  # the statement cannot be read again: the line's text
    position = inplace_position(kind)
    passed = [k.value for k in call.keywords if k.arg == "inplace"]
    if position is not None and len(call.args) > position:
        passed.append(call.args[position])
    return any(isinstance(v, ast.Constant) and v.value is True for v in passed)


def inplace_position(kind: str) -> int | None:
    """Where ``inplace`` sits among the positional parameters of the framework's module class ``kind``
    (``ReLU(True)``: 0, ``Dropout(0.5, True)``: 1), read from its signature; None when unknown."""
    torch = sys.modules.get("torch")  # loaded by the guarded script, or by gradguard fix (fix/verify.py)
    if torch is None:
        return None
    cls = getattr(torch.nn, kind, None)
    try:
        # the class's own __init__ (a signature, never called)
        names = list(inspect.signature(cls.__init__).parameters)[1:] if isinstance(cls, type) else []  # type: ignore[misc]
    except (TypeError, ValueError):
        return None
    return names.index("inplace") if "inplace" in names else None


def writer_sites(files: list[str], via: str | None) -> tuple[list[ModuleSite], list[SourceLocation], bool] | None:
    """For a write made by a module in place (``via``: ``net.gate.2 (ReLU(inplace=True))``): where that instance
    was constructed, the statements that switched it to in-place later, and whether the instance was resolved
    (False: every ``Kind(inplace=True)`` in ``files``, the instance unknown). None for any other write."""
    split = split_module_via(via)
    if split is None:
        return None
    path, kind = split
    sites = instance_sites(files, path, kind) if path else []
    switches = inplace_switches(files, path)
    if sites or switches:
        return sites, switches, True
    fallback = [ModuleSite(loc, None, loc.line) for file in dict.fromkeys(files)
                for loc in keyword_calls(file, kind, "inplace", True)]
    return fallback, [], False


def path_in_user_self(module: object, start: FrameType | None = None) -> str | None:
    """``self.gate`` for a module reached as an attribute of the ``self`` of a user frame (``Net.forward`` calling
    ``self.gate(x)``): the path a construction can be looked up by when no variable holds the module. Error
    paths only (it walks the user's frames, from ``start`` or the caller's)."""
    for frame in user_frames(start or sys._getframe(1)):
        owner = frame.f_locals.get("self")
        named = getattr(owner, "named_modules", None)
        if named is None or owner is module:
            continue
        for name, inner in named():
            if inner is module and name:
                return f"self.{name}"
    return None


def _takes_inplace(node: ast.AST) -> bool:
    """A ``def`` with an ``inplace`` parameter, or a class whose ``__init__`` has one."""
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        return init is not None and _takes_inplace(init)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        arguments = node.args
        return any(a.arg == "inplace" for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs))
    return False


def inplace_parameter_calls(files: list[str], file: str, line: int) -> list[tuple[SourceLocation, str]]:
    """Calls in the statement at ``file:line`` of the user's own classes or factories that take an ``inplace``
    parameter (torchvision's ``MLP(..., inplace=True)`` building Dropout(**params)): the expression that built the
    writing module when it is made inside code the call configures. (location, callee name as written)."""
    defined: set[str] = set()
    for name in dict.fromkeys(files):
        tree = parse_file(name)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and _takes_inplace(node):
                defined.add(node.name)
    stmt = statement_at(file, line)
    if stmt is None or not defined:
        return []
    found: list[tuple[SourceLocation, str]] = []
    for node in _preorder(stmt):
        if isinstance(node, ast.Call) and (callee := _callee(node)) in defined:  # (only calls have a callee)
            code = linecache.getline(file, node.lineno).strip()
            found.append((SourceLocation(file, node.lineno, "", code), callee))
    return found


def called_inplace_modules(files: list[str], file: str,
                           line: int) -> list[tuple[ModuleSite, str | None, ast.Call]]:
    """Modules called in the statement at ``file:line`` (``self.relu(x)``) that were constructed with
    ``inplace=True`` (``self.relu = nn.ReLU(inplace=True)``): for a write reported without the module that made it
    (autograd refusing a write into a view names only the line). (site, class name, the call in the statement)."""
    stmt = statement_at(file, line)
    if stmt is None:
        return []
    trees = {f: t for f in dict.fromkeys(files) if (t := parse_file(f)) is not None}
    found: list[tuple[ModuleSite, str | None, ast.Call]] = []
    for node in _preorder(stmt):
        attribute = _callee(node)
        if not isinstance(node, ast.Call) or attribute is None:
            continue
        for where, tree, value in _assignments(trees, attribute):
            if not any(k.arg == "inplace" and isinstance(k.value, ast.Constant) and k.value.value is True
                       for k in getattr(value, "keywords", ())):
                continue
            site = _site(where, tree, value, _callee(value))
            if site is not None and all(site != s for s, _, _ in found):
                found.append((site, _callee(value), node))
    return found
