"""Where a function reads a variable again after a call: the source half of "a module wrote into its caller's
tensor and the caller reads that tensor again" (issue 14, class 5).

Framework-free: given a code object, the source range of the call the frame is running and the variable names
bound to the written tensor, return the source ranges of the reads that follow before the name is rebound.
The backend confirms a read when it happens (an op consuming the tensor while the frame runs one of these
ranges), so a read in a branch that is not taken is never reported.

# NOTE [What counts as a read again]
# ``x + self.branch(x)``: Python loads ``x`` before the call and the add reads it after, so every other load
# of the name in the calling statement is a read, before or after the call. After the statement, loads count
# until a statement stores the name (``out = self.relu(out)`` rebinds ``out`` in the calling statement itself:
# nothing after it reads the old value). Metadata (``x.shape``, ``x.dtype``, ``x.device``, ``x.size()``) does
# not change with the values and is no read. A call made as a statement of its own (`self.relu(x)`, result
# unused) is made for its in-place effect: reading `x` afterwards is the point, not a mistake. Loops are read in source order only (a later iteration reading a
# name bound before the loop is not followed).
"""

from __future__ import annotations

import ast
import functools
from types import CodeType, FrameType
from typing import Iterable, Iterator

from .source_ast import COMPOUND, function_node

__all__ = ["Span", "later_reads", "position_of", "span_contains"]

Span = tuple[int, int, int, int]  # (line, end line, column, end column), as ``co_positions`` gives them

_METADATA = frozenset({"shape", "dtype", "device", "size", "dim", "ndim", "numel", "requires_grad", "is_cuda",
                       "layout", "names", "stride", "is_contiguous", "data_ptr", "element_size"})


def position_of(frame: FrameType) -> Span | None:
    """The source range of the instruction ``frame`` is running (the call it is in), or None."""
    positions = _positions(frame.f_code)
    index = frame.f_lasti // 2
    if positions is None or not 0 <= index < len(positions):
        return None
    span = positions[index]
    return span if None not in span else None  # type: ignore[return-value]  # None-free: a Span


@functools.lru_cache(maxsize=512)
def _positions(code: CodeType) -> tuple[tuple[int | None, int | None, int | None, int | None], ...] | None:
    try:
        return tuple(code.co_positions())  # type: ignore[attr-defined]  # Python 3.11+, the lowest checked is 3.10
    except AttributeError:  # Python < 3.11: no column positions, nothing is reported
        return None


def _span(node: ast.expr | ast.stmt) -> Span:
    # end positions are None only on nodes built by hand; these come from ast.parse
    return (node.lineno, node.end_lineno, node.col_offset, node.end_col_offset)  # type: ignore[return-value]


def span_contains(outer: Span, inner: Span) -> bool:
    """Whether source range ``inner`` lies inside ``outer``."""
    return (outer[0], outer[2]) <= (inner[0], inner[2]) and (inner[1], inner[3]) <= (outer[1], outer[3])


def _own_nodes(statement: ast.stmt) -> Iterator[ast.AST]:
    """The expressions of ``statement`` itself, not of the statements nested in its body."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return
    for field, value in ast.iter_fields(statement):
        if field in ("body", "orelse", "finalbody", "handlers"):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, ast.AST):
                yield from ast.walk(item)


def _statements(function: ast.Module | ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    """Every statement of the function (nested blocks included, nested functions excluded), in source order."""
    found: list[ast.stmt] = []

    def visit(body: list[ast.stmt]) -> None:
        for statement in body:
            found.append(statement)
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(statement, field, []) or [])
            for handler in getattr(statement, "handlers", []) or []:
                visit(handler.body)

    visit(function.body)
    return sorted(found, key=lambda s: (s.lineno, s.col_offset))


def _reads_and_stores(
    nodes: Iterable[ast.AST], names: frozenset[str], parents: dict[ast.AST, ast.AST], skip: Span | None
) -> tuple[list[tuple[str, Span]], set[str]]:
    reads: list[tuple[str, Span]] = []
    stores: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Name) and node.id in names:
            if isinstance(node.ctx, ast.Store):
                stores.add(node.id)
            elif isinstance(node.ctx, ast.Load) and not (isinstance(parent := parents.get(node), ast.Attribute)
                                                         and parent.attr in _METADATA):  # metadata: no read
                if skip is None or not span_contains(skip, _span(node)):
                    reads.append((node.id, _span(node)))
    return reads, stores


@functools.lru_cache(maxsize=1024)
def later_reads(code: CodeType, call: Span, names: frozenset[str]) -> tuple[tuple[str, Span], ...]:
    """The loads of ``names`` that read the value they held while the call at ``call`` ran: other loads in the
    calling statement, then loads in the statements after it until the name is stored again. Empty when the
    source cannot be read."""
    function = function_node(code.co_filename, code.co_firstlineno, code.co_name)
    if function is None:
        return ()
    statements = _statements(function)
    calling = None
    for statement in statements:
        if not isinstance(statement, COMPOUND) and span_contains(_span(statement), call):
            calling = statement
    if calling is None:
        return ()
    if isinstance(calling, ast.Expr) and _span(calling.value) == call:
        return ()  # `self.relu(x)` as a statement: called for its in-place effect on purpose
    parents = {child: parent for parent in ast.walk(function) for child in ast.iter_child_nodes(parent)}
    the_call = next((n for n in ast.walk(calling) if isinstance(n, ast.Call) and _span(n) == call), None)
    skip = _span(the_call) if the_call is not None else call
    reads, stores = _reads_and_stores(ast.walk(calling), names, parents, skip)
    live = set(names) - stores
    for statement in statements:
        if not live:
            break
        if (statement.lineno, statement.col_offset) <= (calling.lineno, calling.col_offset):
            continue
        found, stored = _reads_and_stores(_own_nodes(statement), frozenset(live), parents, None)
        reads.extend(found)
        live -= stored
    return tuple(reads)
