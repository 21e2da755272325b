"""Statements of a function that change a tensor through ``.data`` from the tensor's own value: the source half
of "a forward normalises its weight through .data" (issue 14, class 7).

``self.w.data = F.normalize(self.w.data, dim=0)``, ``self.weight.data.div_(norm)``,
``self.weight.data.copy_(self.weight / n)``: autograd never sees the transformation, so the gradient is taken
as if the weight were used as stored (ydwen/opensphere#7, cvqluu/Angular-Penalty-Softmax-Losses-Pytorch#3,
Stack Overflow 74020337). Framework-free: the backend evaluates each target in the running frame and compares
it with the parameter being saved.

# NOTE [Which .data writes in a forward are reported]
# Only a write whose new value depends on the old one (an in-place op on ``X.data``, or ``X.data = f(X)``):
# data-dependent initialisation (ActNorm's ``self.loc.data.copy_(-mean)`` on the first batch) and resets
# (``.zero_()``, ``.fill_()``, ``.normal_()``) give the parameter a new starting value, which is what they
# mean. Box and max-norm constraints (``.clamp_``, ``.clip_``, ``.renorm_``) are projected gradient descent,
# the gradient at the projected point on purpose. Only statements of the function body itself, or inside ``with`` and ``for`` blocks of it (a branch
# may not have run), and before the line that saves the parameter.
"""

from __future__ import annotations

import ast
import functools
import linecache
from typing import Iterator

from .source_ast import function_node, parse_file

__all__ = ["DataStatement", "data_statements", "may_write_data"]

_RESETS = frozenset({"zero_", "fill_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_",
                     "geometric_", "log_normal_", "cauchy_"})
# Box constraints (weight clipping, non-negativity, max-norm): projected gradient descent on purpose.
_PROJECTIONS = frozenset({"clamp_", "clip_", "clamp_min_", "clamp_max_", "renorm_"})

DataStatement = tuple[str, int, str]  # (target expression as written, line, the statement's code)


def _mentions(node: ast.AST, target: str) -> bool:
    return any(isinstance(n, (ast.Attribute, ast.Name, ast.Subscript)) and ast.unparse(n) == target
               for n in ast.walk(node))


def _data_target(node: ast.AST) -> str | None:
    """``self.w`` for ``self.w.data`` (also ``self.w.data[...]``)."""
    if isinstance(node, ast.Subscript):
        node = node.value
    return ast.unparse(node.value) if isinstance(node, ast.Attribute) and node.attr == "data" else None


def _statement_writes(statement: ast.stmt) -> str | None:
    if isinstance(statement, (ast.Assign, ast.AugAssign)):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        for target in targets:
            name = _data_target(target)
            if name is not None and (isinstance(statement, ast.AugAssign) or _mentions(statement.value, name)):
                return name
    elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        if isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.startswith("_"):
            name = _data_target(func.value)
            if name is not None and func.attr not in _RESETS and func.attr not in _PROJECTIONS:
                if func.attr != "copy_" or any(_mentions(a, name) for a in statement.value.args):
                    return name
    return None


def _walk(body: list[ast.stmt], filename: str) -> Iterator[DataStatement]:
    for statement in body:
        if isinstance(statement, (ast.With, ast.AsyncWith, ast.For, ast.AsyncFor)):
            yield from _walk(statement.body, filename)
            continue
        target = _statement_writes(statement)
        if target is not None:
            yield target, statement.lineno, linecache.getline(filename, statement.lineno).strip()


@functools.lru_cache(maxsize=4096)
def may_write_data(filename: str, name: str) -> bool:
    """Whether some function ``name`` of ``filename`` has a ``.data`` write of the kind above: one dict lookup per
    saved parameter once known, so the frames are walked only in forwards that have one."""
    if ".data" not in "".join(linecache.getlines(filename)):
        return False
    tree = parse_file(filename)
    if tree is None:
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
               and next(_walk(node.body, filename), None) is not None for node in ast.walk(tree))


@functools.lru_cache(maxsize=512)
def data_statements(filename: str, first_line: int, name: str) -> tuple[DataStatement, ...]:
    """The ``.data`` writes (see the NOTE) of the function ``name`` defined at ``first_line`` of ``filename``."""
    node = function_node(filename, first_line, name)
    return tuple(_walk(node.body, filename)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else ()
