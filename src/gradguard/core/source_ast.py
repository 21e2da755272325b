"""Read the user's own source to name things an exception does not name.

Used only on error paths (eager in-place errors raised by the framework at the write), never per op.
"""

from __future__ import annotations

import ast
import functools
import linecache
from typing import Any, Iterator, Mapping

from .findings import SourceLocation

__all__ = ["COMPOUND", "bodies_with_line", "line_in_block", "written_expression", "assignment_before",
           "item_assignment_before", "container_entries", "backward_receiver", "call_name", "callee_of",
           "dotted_reference", "evaluate_reference", "function_node",
           "parse_code", "parse_file", "parse_statement", "reference_prefixes", "written_reference"]


# statements with a body of statements: never "the statement on a line"
COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.With, ast.For, ast.While, ast.If, ast.Try,
            ast.AsyncWith, ast.AsyncFor)


def parse_code(code: str) -> ast.Module | None:
    """The syntax tree of ``code``, or None when it is not Python."""
    try:
        return ast.parse(code)
    except SyntaxError:
        return None


def parse_statement(code: str) -> ast.stmt | None:
    """The first statement of ``code``, or None (not Python, or no statement)."""
    tree = parse_code(code)
    return tree.body[0] if tree is not None and tree.body else None


def parse_file(filename: str) -> ast.Module | None:
    """The syntax tree of ``filename`` as linecache holds it, or None (no source, or not Python)."""
    source = "".join(linecache.getlines(filename))
    return parse_code(source) if source else None


def statement_at(filename: str, line: int) -> ast.stmt | None:
    tree = parse_file(filename)
    if tree is None:
        return None
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if not isinstance(node, COMPOUND):
                best = node
    return best


@functools.lru_cache(maxsize=512)
def function_node(
    filename: str, first_line: int, name: str
) -> ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The ``def`` of function ``name`` whose first line (``co_firstlineno``: the def or a decorator) is
    ``first_line`` in ``filename``; the module itself for ``<module>``; None when the source cannot be read."""
    tree = parse_file(filename)
    if tree is None or name == "<module>":
        return tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            if first_line in [node.lineno] + [d.lineno for d in node.decorator_list]:
                return node
    return None


def callee_of(code: str, *, keyword: str | None = None, argument: str | None = None) -> str | None:
    """The callee as written (``F.relu``, ``self.conv``) of the first call on ``code`` that passes ``keyword``,
    or the name ``argument`` as a positional argument."""
    tree = parse_code(code.strip())
    for node in ast.walk(tree) if tree is not None else ():
        if not isinstance(node, ast.Call):
            continue
        if (keyword is not None and any(k.arg == keyword for k in node.keywords)) or (
                argument is not None and any(isinstance(a, ast.Name) and a.id == argument for a in node.args)):
            return ast.unparse(node.func)
    return None


def _getattr_parts(node: ast.AST) -> tuple[ast.expr, ast.expr] | None:
    """(object, name) of ``getattr(obj, name)`` with a constant or variable name (an attribute reached by a name
    computed at run time: ``getattr(module, name).copy_(data)``), else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) == 2 and not node.keywords and isinstance(node.args[1], (ast.Constant, ast.Name))):
        return node.args[0], node.args[1]
    return None


def _is_plain_reference(node: ast.AST, dynamic: bool = False) -> bool:
    """A name, or attribute and index steps on one (``model.layer[2].weight``, ``layers[i].w``): what
    ``evaluate_reference`` can look up without running user code. ``dynamic``: ``getattr(obj, name)`` steps too
    (only where the caller resolves them in a frame, see ``dotted_reference``)."""
    while True:
        parts = _getattr_parts(node) if dynamic else None
        if parts is not None:
            node = parts[0]
        elif isinstance(node, (ast.Attribute, ast.Subscript)):
            if isinstance(node, ast.Subscript) and _index_of(node.slice) is None:
                return False
            node = node.value
        else:
            return isinstance(node, ast.Name)


_Step = tuple[str, Any]  # ("attr", name), ("getattr" | "index", an index: see _index_of)


def _index_of(node: ast.expr) -> tuple[str, Any] | None:
    """``("constant", value)``, ``("name", variable)`` or ``("tuple", (index, ...))`` for an index made of
    constants and names (``blocks[(c0, c1)]``), None for any other (it would run user code)."""
    if isinstance(node, ast.Constant):
        return "constant", node.value
    if isinstance(node, ast.Name):
        return "name", node.id
    if isinstance(node, ast.Tuple) and node.elts and not isinstance(node.ctx, ast.Store):
        elements = tuple(_index_of(e) for e in node.elts)
        return None if any(e is None for e in elements) else ("tuple", elements)
    return None


def _spelt(what: tuple[str, Any]) -> str:
    """An index as the user wrote it: ``0``, ``'k'``, ``i``, ``(c0, c1)``."""
    if what[0] == "tuple":
        inner = ", ".join(_spelt(e) for e in what[1])
        return f"({inner},)" if len(what[1]) == 1 else f"({inner})"
    return repr(what[1]) if what[0] == "constant" else what[1]


@functools.lru_cache(maxsize=1024)
def _reference_steps(expression: str) -> tuple[str, tuple[_Step, ...]] | None:
    """``model.layers[i].weight`` -> ("model", (("attr", "layers"), ("index", ("name", "i")), ("attr", "weight"))),
    or None: parsed once per expression (a backward pass looks up its receiver every step)."""
    try:
        node = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return None
    steps: list[_Step] = []
    while True:
        parts = _getattr_parts(node)
        if parts is not None:
            name = parts[1]
            steps.append(("getattr", ("constant", name.value) if isinstance(name, ast.Constant) else (
                "name", name.id if isinstance(name, ast.Name) else "")))
            node = parts[0]
        elif isinstance(node, ast.Attribute):
            steps.append(("attr", node.attr))
            node = node.value
        elif isinstance(node, ast.Subscript) and _index_of(node.slice) is not None:
            steps.append(("index", _index_of(node.slice)))
            node = node.value
        elif isinstance(node, ast.Subscript):
            return None  # any other index would run user code
        else:
            break
    return None if not isinstance(node, ast.Name) else (node.id, tuple(reversed(steps)))


def _step_value(what: tuple[str, Any], scope: Mapping[str, Any]) -> Any:
    """The attribute name or index a step holds: its constant, or the variable's value in ``scope``."""
    if what[0] == "tuple":
        return tuple(_step_value(e, scope) for e in what[1])
    return what[1] if what[0] == "constant" else scope.get(what[1])


_CONTAINERS = ("ModuleList", "Sequential", "ModuleDict", "ParameterList", "ParameterDict")


def reference_prefixes(expression: str, scope: Mapping[str, Any]) -> Iterator[tuple[str, object]]:
    """(text, value) of each prefix of a plain reference (see ``_is_plain_reference``) in ``scope``, shortest
    first, as far as the values resolve: ``U``, ``U.blocks``, ``U.blocks[(c0, c1)]``. Attribute steps use getattr,
    index steps only index lists, tuples, dicts and torch module containers: no user code runs."""
    parsed = _reference_steps(expression)
    if parsed is None or parsed[0] not in scope:
        return
    text, steps = parsed
    value = scope[text]
    yield text, value
    for kind, what in steps:
        if kind == "attr":
            text, value = f"{text}.{what}", getattr(value, what, None)
        elif kind == "getattr":
            attribute = _step_value(what, scope)
            if not isinstance(attribute, str):
                return
            text, value = f"{text}.{attribute}", getattr(value, attribute, None)
        else:
            if not isinstance(value, (list, tuple, dict)) and type(value).__name__ not in _CONTAINERS:
                return
            try:
                text, value = f"{text}[{_spelt(what)}]", value[_step_value(what, scope)]
            except (IndexError, KeyError, TypeError):
                return
        if value is None:
            return
        yield text, value


def evaluate_reference(expression: str, scope: Mapping[str, Any]) -> object:
    """The value of a plain reference (see ``_is_plain_reference``) in ``scope`` (a mapping), or None."""
    parsed = _reference_steps(expression)
    if parsed is None:
        return None
    prefixes = list(reference_prefixes(expression, scope))
    return prefixes[-1][1] if len(prefixes) == len(parsed[1]) + 1 else None


def dotted_reference(expression: str, scope: Mapping[str, Any]) -> str | None:
    """``expression`` with each ``getattr(obj, name)`` step written as the attribute it reaches in ``scope``
    (``getattr(module, name)`` -> ``module.weight``), so that it reads, and can be assigned, like the user's
    other references; None when a name does not resolve to an identifier."""
    parsed = _reference_steps(expression)
    if parsed is None:
        return None
    text, steps = parsed
    for kind, what in steps:
        if kind == "attr":
            text += "." + what
        elif kind == "getattr":
            attribute = _step_value(what, scope)
            if not (isinstance(attribute, str) and attribute.isidentifier()):
                return None
            text += "." + attribute
        else:
            text += f"[{_spelt(what)}]"
    return text


def _is_inplace_name(name: str) -> bool:
    return name.endswith("_") and not name.endswith("__")


_NAMESPACES = frozenset({"torch", "F", "nn", "functional"})  # `torch.relu_(x)`, `F.relu_(x)`, `nn.init.zeros_(w)`


def _inplace_call_target(node: ast.Call, func: ast.Attribute, dynamic: bool = False) -> ast.expr | None:
    """What the in-place method call ``node`` writes: its receiver, or the first argument of ``torch.relu_(x)``
    (a function of a namespace). A receiver that is no plain reference (``make().add_(x)``) is written, not the
    argument: None then."""
    base = func.value
    # a chain of in-place methods writes its innermost receiver: `c` in `c.mul_(s).add_(m)`
    while isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute) and _is_inplace_name(base.func.attr):
        base = base.func.value
    out = _out_keyword(base) if isinstance(base, ast.Call) else None
    if out is not None:
        return out  # `torch.arange(n, out=w).mul_(s)` writes w
    root = base
    while isinstance(root, ast.Attribute):
        root = root.value
    if isinstance(root, ast.Name) and root.id in _NAMESPACES and isinstance(base, (ast.Name, ast.Attribute)):
        return node.args[0] if node.args else None
    return base if _is_plain_reference(base, dynamic) else None


def _out_keyword(call: ast.Call) -> ast.expr | None:
    """What the call's ``out=`` argument writes, or None."""
    return next((k.value for k in call.keywords if k.arg == "out"), None)


def _call_written(stmt: ast.stmt, dynamic: bool = False) -> ast.expr | None:
    """The expression the first in-place call of ``stmt`` writes (a method ending in ``_``, ``inplace=True`` or
    ``out=``)."""
    for node in ast.walk(stmt):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and _is_inplace_name(node.func.attr):
            return _inplace_call_target(node, node.func, dynamic)
        if node.args and any(k.arg == "inplace" and isinstance(k.value, ast.Constant) and k.value.value is True
                             for k in node.keywords):
            return node.args[0]  # `F.relu(x, inplace=True)` writes x
        out = _out_keyword(node)
        if out is not None:
            return out  # `torch.mul(y, 2, out=y)` writes y
    return None


def _written_target(filename: str, line: int, dynamic: bool) -> ast.expr | None:
    stmt = statement_at(filename, line)
    if stmt is None:
        return None
    if isinstance(stmt, ast.AugAssign):
        return stmt.target
    if isinstance(stmt, ast.Assign) and stmt.targets and isinstance(stmt.targets[0], ast.Subscript):
        return stmt.targets[0].value
    if (isinstance(stmt, ast.Assign) and stmt.targets and isinstance(stmt.targets[0], ast.Attribute)
            and stmt.targets[0].attr == "requires_grad"):
        return stmt.targets[0].value  # `x.requires_grad = False` switches x's autograd off in place
    return _call_written(stmt, dynamic)


def written_expression(filename: str, line: int, dynamic: bool = False) -> str | None:
    """The expression written in place on that line: ``w`` in ``w += 1``, ``x[0] = 1``, ``x.add_(1)``,
    ``torch.relu_(x)``, ``F.relu(x, inplace=True)``. Only plain references are returned (names, attribute and
    simple index steps: safe to evaluate with ``evaluate_reference``); ``dynamic``: ``getattr(obj, name)`` steps
    too, for a caller that resolves them in the writing frame (``dotted_reference``)."""
    target = _written_target(filename, line, dynamic)
    while isinstance(target, ast.Subscript):
        target = target.value
    return None if target is None or not _is_plain_reference(target, dynamic) else ast.unparse(target)


def written_reference(filename: str, line: int) -> str | None:
    """As :func:`written_expression`, with the index steps the write goes through kept (``U.blocks[(c0, c1)]``
    in ``U.blocks[(c0, c1)] *= s``): whether an index picks a tensor out of a container or a part of the tensor
    is a question for the writing frame (``reference_prefixes``)."""
    target = _written_target(filename, line, False)
    while isinstance(target, ast.Subscript) and _index_of(target.slice) is None:
        target = target.value  # a slice or a mask (`x[:, 0]`, `x[x > 0]`): a part of the tensor reached before it
    return None if target is None or not _is_plain_reference(target) else ast.unparse(target)


def assignment_before(filename: str, line: int, expression: str) -> SourceLocation | None:
    """The last statement before ``line`` that binds ``expression`` (a name, attribute chain or subscript)."""
    tree = parse_file(filename)
    found: ast.stmt | None = None
    for node in ast.walk(tree) if tree is not None else ():
        # AugAssign (`w -= x`) writes in place; it does not create w, so it is not a binding here.
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.For, ast.With)) and node.lineno < line:
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.For):
                targets = [node.target]
            elif isinstance(node, ast.With):
                targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
            else:
                targets = [node.target]
            names = set()
            pending = list(targets)
            while pending:  # only what the statement binds: `w.grad = g` binds w.grad, not w; `x[0] = 1` x[0]
                t = pending.pop()
                if isinstance(t, (ast.Tuple, ast.List)):
                    pending.extend(t.elts)
                elif isinstance(t, ast.Starred):
                    pending.append(t.value)
                elif isinstance(t, (ast.Name, ast.Attribute, ast.Subscript)):
                    names.add(ast.unparse(t))
            if expression in names and (found is None or node.lineno > found.lineno):
                found = node
    if found is None:
        return None
    code = linecache.getline(filename, found.lineno).strip()
    return SourceLocation(filename, found.lineno, "", code)


def item_assignment_before(filename: str, line: int, container: str) -> tuple[SourceLocation, str] | None:
    """(the statement, its target) of the last assignment before ``line`` to an item of ``container`` by a key the
    source computes (``state[sid] = hidden``): where a dict or list filled in a loop gets each item."""
    tree = parse_file(filename)
    found: tuple[ast.Assign, str] | None = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Assign) and node.lineno < line and (found is None or node.lineno > found[0].lineno):
            found = next(((node, ast.unparse(t)) for t in node.targets if isinstance(t, ast.Subscript)
                          and ast.unparse(t.value) == container and not isinstance(t.slice, ast.Constant)), found)
    if found is None:
        return None
    return SourceLocation(filename, found[0].lineno, "", linecache.getline(filename, found[0].lineno).strip()), found[1]


_BINOP_NAMES = {"Mult": "multiply", "Add": "add", "Sub": "subtract", "Div": "divide", "MatMult": "matmul", "Pow": "pow"}


_ENTRY_METHODS = frozenset({"append", "appendleft", "insert"})


def container_entries(filename: str, container: str | None) -> list[tuple[int, str, str]]:
    """(line, item, callee) for each statement of the file that puts one item into ``container`` (any container
    when None) (``bank.append(z)``, ``window.appendleft(v)``, ``self.queue.insert(0, k)``), in any function of it."""
    tree = parse_file(filename)
    found = []
    for stmt in ast.walk(tree) if tree is not None else ():
        if not isinstance(stmt, ast.Expr):
            continue
        call = stmt.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in _ENTRY_METHODS \
                and call.args and not call.keywords and container in (None, ast.unparse(call.func.value)):
            found.append((stmt.lineno, ast.unparse(call.args[-1]), ast.unparse(call.func)))
    return sorted(found)


@functools.lru_cache(maxsize=1024)  # read for every backward pass recorded: the same few lines
def backward_receiver(code: str) -> str | None:
    """``errG.backward()`` -> ``errG``; ``torch.autograd.backward(loss)`` -> ``loss``; ``scaler.scale(loss).backward()``
    -> ``loss`` (a call of one argument: a scaling of the loss); ``loss.mean().backward()`` -> ``loss``."""
    tree = parse_code(code.strip())
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.autograd.grad", "autograd.grad"):
            # `torch.autograd.grad(grads, params, ...)` backpropagates its outputs: the first argument
            outputs = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "outputs"), None)
            return ast.unparse(outputs) if isinstance(outputs, (ast.Name, ast.Attribute)) else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward":
            target = _backpropagated(node)
            if isinstance(target, (ast.Name, ast.Attribute)):
                return ast.unparse(target)
    return None


def _backpropagated(call: ast.Call) -> ast.expr | None:
    """What a ``.backward()`` call backpropagates, as written: its receiver (``torch.autograd.backward``'s first
    argument), seen through a scaling of one argument (``scaler.scale(loss)``) and reductions (``loss.mean()``)."""
    assert isinstance(call.func, ast.Attribute)
    receiver = call.func.value
    target = (call.args[0] if call.args else None) if (
        isinstance(receiver, ast.Attribute) and ast.unparse(receiver) == "torch.autograd") else receiver
    if isinstance(target, ast.Call) and len(target.args) == 1 and not target.keywords:
        target = target.args[0]
    while isinstance(target, ast.Call) and isinstance(target.func, ast.Attribute) and not target.args \
            and not target.keywords:  # `loss.mean().backward()`: a reduction of the loss
        target = target.func.value
    return target


def call_name(code: str, operand: str | None = None) -> str | None:
    """Name the op on a source line that saved a tensor, for frameworks whose autograd nodes have no readable
    names: with ``operand`` (``net.w``), the innermost call or binary operation taking it directly
    (``multiply`` in ``z = ops.sin(net.w * x)``); otherwise the single call on the line (``sin`` in
    ``z = ops.sin(y)``) or the operator of a single binary operation (``multiply`` in ``z = x * y``); else None."""
    tree = parse_code(code.strip().rstrip(":"))
    if tree is None:
        return None
    if operand is not None:
        innermost: ast.BinOp | ast.Call | None = None
        for node in ast.walk(tree):  # breadth first: the last match is the innermost
            if isinstance(node, ast.BinOp):
                operands = [node.left, node.right]
            elif isinstance(node, ast.Call):
                operands = [*node.args, *(k.value for k in node.keywords)]
            else:
                continue
            if any(ast.unparse(o) == operand for o in operands):
                innermost = node
        if innermost is not None:
            return _node_name(innermost)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    if not calls:
        binops = [n for n in ast.walk(tree) if isinstance(n, ast.BinOp)]
        if len(binops) == 1:
            return _node_name(binops[0])
    return None if len(calls) != 1 else _node_name(calls[0])


def _node_name(node: ast.BinOp | ast.Call) -> str | None:
    if isinstance(node, ast.BinOp):
        return _BINOP_NAMES.get(type(node.op).__name__)
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def accumulations(filename: str, name: str) -> list[tuple[ast.stmt, ast.stmt | None]]:
    """Statements that add into ``name`` (``name += x`` or ``name = name + x``), each with the loop statement
    directly enclosing it (None outside a loop), in line order."""
    tree = parse_file(filename)
    if tree is None:
        return []
    found: list[tuple[ast.stmt, ast.stmt | None]] = []

    def visit(node: ast.AST, loop: ast.stmt | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.AugAssign) and isinstance(child.target, ast.Name) and child.target.id == name:
                found.append((child, loop))
            elif (isinstance(child, ast.Assign) and len(child.targets) == 1 and isinstance(child.targets[0], ast.Name)
                  and child.targets[0].id == name and isinstance(child.value, ast.BinOp)
                  and isinstance(child.value.left, ast.Name) and child.value.left.id == name):
                found.append((child, loop))
            visit(child, child if isinstance(child, (ast.For, ast.While)) else loop)

    visit(tree, None)
    return sorted(found, key=lambda pair: pair[0].lineno)


def resets_between(filename: str, name: str, start: int, end: int) -> bool:
    """Whether a plain assignment to ``name`` not reading it (``name = 0``) lies on a line in (start, end)."""
    tree = parse_file(filename)
    for node in ast.walk(tree) if tree is not None else ():
        if (isinstance(node, ast.Assign) and start < node.lineno < end
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
                and not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node.value))):
            return True
    return False


def bodies_with_line(tree: ast.AST, line: int) -> Iterator[list[ast.stmt]]:
    """The statement lists in ``tree`` (in walk order) that hold a statement starting at ``line``."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and any(isinstance(b, ast.stmt) and b.lineno == line for b in body):
            yield body


def line_in_block(filename: str, start: int, after: int, function: str | None, line: int,
                  home: str | None) -> int | None:
    """Where a line of ``function`` stands in the block holding line ``start`` (of function ``home``): the line
    itself when both are one function (or either is not known), else the first statement after line ``after`` there
    that calls ``function`` by its name (``update(...)``, ``self.update(...)``): a helper's step or backward stands
    at its call. None when no such call follows."""
    if not function or not home or function == home:
        return line
    tree = parse_file(filename)
    if tree is None or function.startswith("<"):
        return None
    for body in bodies_with_line(tree, start):
        for stmt in body:
            if stmt.lineno > after and any(isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1] == function
                                           for n in ast.walk(stmt)):
                return stmt.lineno
    return None
