"""Read the user's source around a finding to make its fix concrete: the rewritten line, not a template.

Only used on error paths (building a diagnosis), never per op. Every helper returns None (or an empty
result) when the source is unavailable or does not have the expected shape; callers then fall back to
generic wording.
"""

from __future__ import annotations

import ast
import linecache
from dataclasses import replace

from .findings import SourceLocation
from .intents import FixIntent
from .source_ast import parse_file, statement_at

__all__ = [
    "out_of_place",
    "carried_state",
    "CarriedState",
    "step_receivers",
    "mask_assignment",
    "statement_code",
    "single_statement",
    "assigned_names",
    "bound_references",
    "reads",
    "carried_reads",
    "innermost",
    "items_copied_before_loop",
    "keyword_calls",
    "is_valid_python",
]

def single_statement(code: str) -> ast.stmt | None:
    """The one statement ``code`` holds; None when it holds several, none, or does not parse."""
    try:
        body = ast.parse(code.strip()).body
    except SyntaxError:
        return None
    return body[0] if len(body) == 1 else None


def statement_code(location: SourceLocation | None) -> str:
    """The whole statement at ``location`` (may span lines), stripped; falls back to the line itself."""
    if location is None:
        return ""
    stmt = statement_at(location.file, location.line)
    if stmt is None or stmt.end_lineno is None or stmt.end_lineno == stmt.lineno:
        return location.code
    lines = [linecache.getline(location.file, n).strip() for n in range(stmt.lineno, stmt.end_lineno + 1)]
    return " ".join(lines)


def out_of_place(code: str, stands: bool = False, copy_out: bool = False) -> str | None:
    """``h *= 0.5`` -> ``h = h * 0.5``; ``a.mul_(2)`` -> ``a = a.mul(2)``; ``torch.relu_(x)`` -> ``x = torch.relu(x)``;
    ``y = x.div_(n)`` -> ``x = x.div(n); y = x``. The text is the edit ``gradguard fix`` makes (the same libcst
    rewrite); None when there is none (``x.normal_()``: no out-of-place method, see NOTE [Out-of-place methods
    come from the framework]). ``stands``: see NOTE [An in-place call whose receiver cannot be rebound];
    ``copy_out``: a write through ``out=w`` becomes ``w.copy_(...)`` (the same tensor object) instead of ``w = ...``."""
    if single_statement(code) is None:
        return None
    return _rewritten(code, {**({"stands": True} if stands else {}), **({"out": "copy"} if copy_out else {})})


def _rewritten(code: str, detail: dict[str, str]) -> str | None:
    from .edits import EditNotApplicable, apply_intent  # libcst loads on first use, not with the guard

    try:
        edited = apply_intent(code.strip() + "\n", FixIntent("inplace_to_out_of_place", None, 1, detail=detail))
    except EditNotApplicable:
        return None
    return statements_text(edited)


def _rewritten_as(code: str, intent: FixIntent) -> str | None:
    """``code`` (one statement) with ``intent`` applied at its line, as one line of text; None when it does not fit."""
    from .edits import EditNotApplicable, apply_intent

    try:
        return statements_text(apply_intent(code.strip() + "\n", replace(intent, file=None, line=1)))
    except EditNotApplicable:
        return None


def statements_text(source: str) -> str:
    """The statements of ``source`` on one line, comments left out: ``x = x.div(n); y = x``."""
    import libcst as cst

    empty = cst.Module(body=[])
    return "; ".join(empty.code_for_node(small) for line in cst.parse_module(source).body
                     if isinstance(line, cst.SimpleStatementLine) for small in line.body)


def mask_assignment(code: str) -> str | None:
    """``p[p < 0.1] = 0.0`` -> ``p = p.masked_fill(p < 0.1, 0.0)`` when the index is a boolean comparison (or its
    ``~``). The text is the edit ``gradguard fix`` makes: the same libcst rewrite as ``out_of_place``."""
    stmt = single_statement(code)
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript)):
        return None
    mask = stmt.targets[0].slice
    if not (isinstance(mask, ast.Compare) or (isinstance(mask, ast.UnaryOp) and isinstance(mask.op, ast.Invert))):
        return None
    return _rewritten(code, {"method": "masked_fill"})


def assigned_names(code: str) -> list[str]:
    """What an assignment statement binds: ``out, h = rnn(x, h)`` -> ``["out", "h"]``; ``self.u = v`` ->
    ``["self.u"]``. Names used inside a target (``w`` in ``w.grad = g``, ``x`` in ``x[0] = 1``) are not bound."""
    return bound_references(single_statement(code), items=False)


def bound_references(stmt: ast.stmt | None, items: bool = True) -> list[str]:
    """The references an assignment binds, tuple targets unpacked (``h, c = ...`` binds ``h`` and ``c``), items
    (``state["h"] = ...``) included unless ``items`` is False."""
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target]
    names: list[str] = []
    kinds = (ast.Name, ast.Attribute, ast.Subscript) if items else (ast.Name, ast.Attribute)

    def collect(target: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                collect(element)
        elif isinstance(target, ast.Starred):
            collect(target.value)
        elif isinstance(target, kinds):
            names.append(ast.unparse(target))

    for target in targets:
        collect(target)
    return names


def reads(node: ast.AST | None, reference: str) -> bool:
    """Whether ``node`` reads ``reference`` (a name, attribute or item, as ``ast.unparse`` spells it)."""
    return node is not None and any(isinstance(n, (ast.Name, ast.Attribute, ast.Subscript))
                                    and ast.unparse(n) == reference for n in ast.walk(node))


def carried_reads(stmt: ast.stmt | None) -> list[str]:
    """What an assignment binds from its own previous value (``h = cell(x, h)``; both of ``h, c = cell(x, (h,
    c))``): each read on its right is the previous step's value, a path into the previous step's graph."""
    if not isinstance(stmt, ast.Assign):
        return []
    return [ref for ref in dict.fromkeys(bound_references(stmt)) if reads(stmt.value, ref)]


# -- loops ---------------------------------------------------------------------------------------------


def innermost(tree: ast.AST, line: int, kinds: tuple[type, ...]) -> ast.AST | None:
    """The innermost node of one of ``kinds`` whose lines hold ``line`` (the loop around it, its function)."""
    best = None
    for node in ast.walk(tree):
        if isinstance(node, kinds) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno >= best.lineno:
                best = node
    return best


def items_copied_before_loop(file: str, line: int, name: str) -> FixIntent | None:
    """``parts = [p.clone() for p in parts]`` before ``for p in parts:``, for a write into ``name`` (``p``) at
    ``line`` inside the innermost loop that binds it, when that loop walks a plain name: the loop then writes
    copies, where rebinding ``p`` would drop the write."""
    tree = parse_file(file)
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.For) and n.lineno < line <= (n.end_lineno or n.lineno)
             and isinstance(n.target, ast.Name) and n.target.id == name] if tree is not None else []
    loop = max(loops, key=lambda n: n.lineno, default=None)
    if loop is None or not isinstance(loop.iter, ast.Name):
        return None
    container = loop.iter.id
    return FixIntent("insert_before", file, loop.lineno, target=container,
                     detail={"code": f"{container} = [{name}.clone() for {name} in {container}]"},
                     reason=f"the loop at line {loop.lineno} then writes copies of the items of `{container}`")


class CarriedState:
    """A variable whose value flows from one loop iteration into the next (``h_cur`` in the RNN seed)."""

    def __init__(self, name: str, assignment: SourceLocation, source: str | None, reads_itself: tuple[str, ...] = ()):
        self.name = name
        self.assignment = assignment  # the statement that stores next iteration's value
        self.source = source  # ``h_next`` in ``h_cur = h_next``; None when bound by a call's results
        # ``h = cell(x, h)``, ``avg = 0.9 * avg + m``: the read on the right is the previous iteration's value, the
        # crossing itself; detached there, this iteration's value keeps its gradient for the loss that reads it
        # next (a detach after the assignment would cut that). Every reference it carries so (``h`` and ``c`` in
        # ``h, c = cell(x, (h, c))``): detaching one leaves the other a path into the freed graph.
        self.reads_itself = reads_itself

    def detach_fix(self, is_tuple: bool = False) -> str:
        """The line that detaches it where it crosses the iteration boundary."""
        if self.source is not None and not is_tuple:
            return f"`{self.name} = {self.source}.detach()` (line {self.assignment.line})"
        if self.reads_itself and not is_tuple:
            edited = _rewritten_as(self.assignment.code, self.detach_intent())
            if edited:
                return f"`{edited}` (line {self.assignment.line})"
        return f"`{self._detached_statement(is_tuple)}` right after line {self.assignment.line}"

    def _detached_statement(self, is_tuple: bool) -> str:
        detached = (f"tuple(s.detach() for s in {self.name})" if is_tuple else f"{self.name}.detach()")
        return f"{self.name} = {detached}"

    def detach_intent(self, is_tuple: bool = False) -> FixIntent:
        """The same fix as :meth:`detach_fix`, as a structured edit."""
        names = " and ".join(f"`{name}`" for name in self.reads_itself or (self.name,))
        crosses = "they cross" if len(self.reads_itself) > 1 else "it crosses"
        reason = f"detach {names} where {crosses} into the next iteration"
        file, line = self.assignment.file, self.assignment.line
        if self.source is not None and not is_tuple:
            return FixIntent("detach_assignment", file, line, target=self.name, reason=reason)
        if self.reads_itself and not is_tuple:  # a tuple read may be None on the first step: detached after
            many = {"targets": list(self.reads_itself)} if len(self.reads_itself) > 1 else {}
            return FixIntent("detach_expression", file, line, target=self.name, reason=reason, detail=many)
        return FixIntent("insert_after", file, line, target=self.name,
                         detail={"code": self._detached_statement(is_tuple)}, reason=reason)


def _loads_and_stores(stmt: ast.stmt) -> tuple[list[str], list[str]]:
    """Names read and names written by one simple statement, reads first (Python evaluates the value
    before binding the targets)."""
    loads, stores = [], []
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else stores).append(node.id)
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        loads.append(stmt.target.id)
    return loads, stores


def _simple_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements of a loop body in execution order, compound statements flattened (their headers are
    skipped, nested loops included: what matters is the order of reads and writes)."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.AsyncFor, ast.AsyncWith)):
            for field in ("body", "orelse", "handlers", "finalbody"):
                children = getattr(stmt, field, None) or []
                for child in children:
                    if isinstance(child, ast.ExceptHandler):
                        out.extend(_simple_statements(child.body))
                    else:
                        out.extend(_simple_statements([child]))
        elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(stmt)
    return out


def carried_state(location: SourceLocation | None) -> list[CarriedState]:
    """Variables of the loop around ``location`` that are read before they are (re)assigned in the loop
    body: their value at the start of an iteration comes from the previous one. Loop targets and
    augmented accumulators of plain numbers cannot be told apart from tensors here, so the caller keeps
    only those the finding makes plausible."""
    if location is None:
        return []
    tree = parse_file(location.file)
    if tree is None:
        return []
    loop = innermost(tree, location.line, (ast.For, ast.While, ast.AsyncFor))
    if loop is None:
        return []
    loop_targets = set()
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        loop_targets = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    assigned: set[str] = set()
    read_first: list[str] = []
    last_store: dict[str, ast.stmt] = {}
    for stmt in _simple_statements(loop.body):
        loads, stores = _loads_and_stores(stmt)
        for name in loads:
            if name not in assigned and name not in read_first:
                read_first.append(name)
        for name in stores:
            assigned.add(name)
            last_store[name] = stmt
    carried = []
    for name in read_first:
        stmt = last_store.get(name)
        if stmt is None or name in loop_targets:
            continue
        source = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            if isinstance(stmt.value, (ast.Name, ast.Attribute)):
                source = ast.unparse(stmt.value)
        code = linecache.getline(location.file, stmt.lineno).strip()
        carried.append(CarriedState(name, SourceLocation(location.file, stmt.lineno, location.function, code), source,
                                    _reads_itself(stmt, name)))
    return carried


def _reads_itself(stmt: ast.stmt, name: str) -> tuple[str, ...]:
    """``h = cell(x, h)`` on one line, ``name`` among what it carries: everything the assignment carries from its
    own previous value (``h`` and ``c`` in ``h, c = cell(x, (h, c))``); () otherwise, and for one state among
    other results (``out, h = gru(x, h)``: ``h`` may start as None, which a detach after the assignment allows)."""
    carried = carried_reads(stmt) if stmt.end_lineno == stmt.lineno else []
    alone = isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    return tuple(carried) if name in carried and (alone or len(carried) > 1) else ()


def crossing_recompute(call: SourceLocation | None, step: SourceLocation | None,
                       backward: SourceLocation | None) -> tuple[str, str, str] | None:
    """``(name, argument, code)``: a value the failing loss reads that another model made from an output of the
    stepped model before the step (FactorVAE's ``D_z = D(z)`` with ``z`` from ``VAE_model(x)``), recomputed
    from that output detached (``D_z = D(z.detach())``) to insert after the step. ``call``: the user's call of
    the stepped model (the saver's chain); all three lines in one function, in the order call < step < backward.

    # NOTE [Recomputing the value that crosses into the stepped model's graph]
    # The second loss reaches the stepped model's graph only through values made from its outputs. When such a
    # value is one call of another model on one of those outputs, recomputing it after the step from the output
    # detached keeps the second loss inside the other model (its own gradient is unchanged: the other model's
    # weights have not been stepped yet) and cuts the path whose saved weights the step overwrote.
    """
    statements = _statements_around(call, step, backward)
    made = next((st for st in statements if st.lineno <= call.line <= (st.end_lineno or st.lineno)), None)
    if made is None:
        return None
    outputs = set(_loads_and_stores(made)[1])
    between = [st for st in statements if made.lineno < st.lineno < step.line]
    later = [st for st in statements if step.line < st.lineno <= backward.line]
    for st in between:
        if not _one_call_on(st, outputs):
            continue
        name, argument = st.targets[0].id, st.value.args[0].id
        if any(name in _loads_and_stores(x)[0] for x in later) and not any(
                name in _loads_and_stores(x)[1] for x in later):
            code = f"{name} = {ast.unparse(st.value.func)}({argument}.detach())"
            return name, argument, code
    return None


def _statements_around(call: SourceLocation | None, step: SourceLocation | None,
                       backward: SourceLocation | None) -> list:
    """The simple statements of the function holding ``call`` < ``step`` <= ``backward`` (one file); else []."""
    if call is None or step is None or backward is None or not call.line < step.line <= backward.line:
        return []
    if len({call.file, step.file, backward.file}) != 1:
        return []
    tree = parse_file(call.file)
    if tree is None:
        return []
    scope = innermost(tree, step.line, (ast.FunctionDef, ast.AsyncFunctionDef)) or tree
    if not (scope is tree or scope.lineno <= call.line and backward.line <= (scope.end_lineno or scope.lineno)):
        return []
    return _simple_statements(scope.body)


def _one_call_on(st: ast.stmt, outputs: set) -> bool:
    """``name = f(output)``: one positional argument, one of ``outputs``, no keywords."""
    return (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
            and isinstance(st.value, ast.Call) and len(st.value.args) == 1 and not st.value.keywords
            and isinstance(st.value.args[0], ast.Name) and st.value.args[0].id in outputs)


def step_receivers(location: SourceLocation | None) -> list[str]:
    """Distinct receivers of ``X.step()`` calls in the function (or module) around ``location``:
    ``["opt_d", "opt_g"]`` tells a two-model setup (GAN, actor-critic) from one optimizer."""
    if location is None:
        return []
    tree = parse_file(location.file)
    if tree is None:
        return []
    scope = innermost(tree, location.line, (ast.FunctionDef, ast.AsyncFunctionDef)) or tree
    receivers: list[str] = []
    for node in ast.walk(scope):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step"
                and not node.args):
            receiver = ast.unparse(node.func.value)
            if receiver not in receivers:
                receivers.append(receiver)
    return receivers


def is_valid_python(code: str) -> bool:
    """Whether ``code`` parses as Python (every code suggestion is checked with this before it is shown)."""
    try:
        ast.parse(code.strip())
    except SyntaxError:
        return False
    return True


def keyword_calls(filename: str | None, callee: str, keyword: str, value: object = True) -> list[SourceLocation]:
    """Statements of ``filename`` that call ``callee`` (``ReLU``, ``nn.ReLU``, ``torch.nn.ReLU``) with
    ``keyword=value``: where ``nn.ReLU(inplace=True)`` was written, which is the line a fix edits."""
    if not filename:
        return []
    tree = parse_file(filename)
    if tree is None:
        return []
    found: list[SourceLocation] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name != callee:
            continue
        if any(k.arg == keyword and isinstance(k.value, ast.Constant) and k.value.value == value
               for k in node.keywords):
            code = linecache.getline(filename, node.lineno).strip()
            found.append(SourceLocation(filename, node.lineno, "", code))
    return sorted(found, key=lambda loc: loc.line)
