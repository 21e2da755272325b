"""Turn a :class:`~gradguard.core.FixIntent` into an edit of the user's source, with libcst.

# NOTE [Minimal edits that keep the user's formatting]
# libcst keeps every byte it does not rewrite (comments, blank lines, quotes, trailing commas), so an edit
# changes only the node an intent names: one argument, one keyword, one statement's value. Statements are
# found by line (the line a frame reported, which may be any line of a multi-line statement); names and
# expressions are matched by their code with whitespace ignored. An intent whose statement does not have the
# expected shape raises EditNotApplicable with the reason: ``gradguard fix`` then reports it and never guesses.
"""

from __future__ import annotations

import ast
import functools
from typing import TYPE_CHECKING, Any, Callable, TypeAlias, TypeGuard, cast

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .intents import FixIntent, out_of_place_method

__all__ = ["EditNotApplicable", "apply_intent", "apply_intents"]

if TYPE_CHECKING:
    class _InplaceCall(cst.Call):
        """What ``_is_inplace_method`` tells the type checker: a call whose callee is an attribute."""

        func: cst.Attribute

    # What an intent makes of its statement: the new statement, several (inserted or moved ones), or None (removed)
    _Replacement: TypeAlias = cst.BaseStatement | list[cst.BaseStatement] | None
    # An action's edit of (statement, intent, locate, after): what the statement becomes
    _Edit: TypeAlias = Callable[[cst.SimpleStatementLine, FixIntent, "_Locate", dict[int, list[cst.BaseStatement]]],
                                _Replacement]


class EditNotApplicable(Exception):
    """The intent does not match the source (the statement moved, or has another shape); ``str()`` says why."""


_AUG_TO_BINARY: dict[type[cst.BaseAugOp], Callable[[], cst.BaseBinaryOp]] = {
    cst.AddAssign: cst.Add, cst.SubtractAssign: cst.Subtract, cst.MultiplyAssign: cst.Multiply,
    cst.DivideAssign: cst.Divide, cst.FloorDivideAssign: cst.FloorDivide, cst.ModuloAssign: cst.Modulo,
    cst.PowerAssign: cst.Power, cst.MatrixMultiplyAssign: cst.MatrixMultiply, cst.BitAndAssign: cst.BitAnd,
    cst.BitOrAssign: cst.BitOr, cst.BitXorAssign: cst.BitXor, cst.LeftShiftAssign: cst.LeftShift,
    cst.RightShiftAssign: cst.RightShift,
}
# Expressions that need no parentheses as the receiver of `.detach()` or the right operand of `x op ...`.
_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float, cst.SimpleString)
_EMPTY = cst.Module(body=[])


def _code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def _same(code: str, text: str | None) -> bool:
    return text is not None and _normal(code) == _normal(text)


@functools.lru_cache(maxsize=1024)
def _normal(code: str) -> str:
    """An expression as Python reads it: ``state["h"]`` is ``state['h']`` (names come from runtime reprs)."""
    try:
        return ast.unparse(ast.parse(code.strip(), mode="eval"))
    except SyntaxError:
        return "".join(code.split())


def _atom(expression: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(expression, _ATOMS) or expression.lpar:
        return expression
    return expression.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _method(expression: cst.BaseExpression, name: str) -> cst.Call:
    """``expression.name()``."""
    return cst.Call(func=cst.Attribute(value=_atom(expression), attr=cst.Name(name)))


def _statements(code: str) -> list[cst.SimpleStatementLine]:
    """The simple statements of ``code`` (one per line; a forward re-run inside a loop may be several)."""
    try:
        parsed = cst.parse_module(code + "\n").body
    except cst.ParserSyntaxError as error:
        raise EditNotApplicable(f"the statement to insert is not valid Python: {code!r}") from error
    if not parsed or not all(isinstance(s, cst.SimpleStatementLine) for s in parsed):
        raise EditNotApplicable(f"expected simple statements to insert, got {code!r}")
    return [s.with_changes(leading_lines=[]) for s in parsed]  # type: ignore[misc]  # all simple: checked above


class _Locate(cst.CSTVisitor):
    """The innermost statement (simple line or compound) that spans each of ``lines``."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, *lines: int) -> None:
        self.lines = lines
        # line -> statement (looked up with None too: an intent without a line, which finds nothing)
        self.found: dict[int | None, cst.BaseStatement] = {}
        self.following: dict[int, cst.BaseStatement] = {}  # id(statement) -> the next one in its block

    def next_is_same(self, line: int, other: int | None) -> bool:
        """The statement after the one at ``line`` reads exactly as the one at ``other``."""
        nxt, moved = self.following.get(id(self.found.get(line))), self.found.get(other)
        simple = (cst.SimpleStatementLine,)
        return isinstance(nxt, simple) and isinstance(moved, simple) and (  # comments aside
            [_code(n) for n in nxt.body] == [_code(n) for n in moved.body])

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.Module, cst.IndentedBlock)):
            self.following.update((id(a), b) for a, b in zip(node.body, node.body[1:]))
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            span = self.get_metadata(PositionProvider, node)
            for line in self.lines:
                if span.start.line <= line <= span.end.line:
                    self.found[line] = node  # pre-order: a nested statement comes after its parent
        return True


# A `with` left empty by a removed statement goes too when entering and leaving it has no effect besides what the
# block did (a profiler label, a grad mode); any other manager (an open file, a lock) keeps `pass` in its body.
_EFFECTLESS_MANAGERS = ("record_function", "no_grad", "enable_grad", "set_grad_enabled", "autocast", "nullcontext",
                        "inference_mode")


class _Replace(cst.CSTTransformer):
    """Replace the statements in ``changes`` (by identity) with a node, several nodes, or nothing. A block whose
    statements are all removed gets ``pass`` (or disappears, for an effect-free ``with``)."""

    def __init__(self, changes: dict[int, _Replacement]) -> None:
        self.changes = changes  # id(original statement) -> replacement
        self.emptied: set[int] = set()  # ids of the blocks that got `pass` because everything in them was removed

    # libcst declares on_leave generic in the node type (a node of the same kind back); this one replaces
    # statements by other statements, and empty blocks by `pass`
    def on_leave(  # type: ignore[override]
        self, original: cst.CSTNode, updated: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.BaseStatement]:
        if isinstance(updated, cst.IndentedBlock) and not updated.body and original.body:  # type: ignore[attr-defined]  # same kind
            block = updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
            self.emptied.add(id(block))
            return block
        if isinstance(updated, cst.With) and id(updated.body) in self.emptied and all(
                _code(item.item).split("(")[0].rsplit(".", 1)[-1] in _EFFECTLESS_MANAGERS for item in updated.items):
            return cst.RemoveFromParent()
        if id(original) not in self.changes:
            return updated
        replacement = self.changes[id(original)]
        if replacement is None:
            return cst.RemoveFromParent()
        if isinstance(replacement, list):
            return cst.FlattenSentinel(replacement)
        return replacement


class _ExpressionEdit(cst.CSTTransformer):
    """Rewrite the first expression matching ``match`` (a predicate on nodes) with ``rewrite``."""

    def __init__(self, match: Callable[[cst.BaseExpression], bool],
                 rewrite: Callable[[Any], cst.BaseExpression]) -> None:  # rewrite: of a node ``match`` accepted
        self.match, self.rewrite, self.done = match, rewrite, False

    def on_leave(  # type: ignore[override]  # (see _Replace.on_leave) an expression for an expression
        self, original: cst.CSTNode, updated: cst.CSTNode
    ) -> cst.CSTNode:
        if not self.done and isinstance(original, cst.BaseExpression) and self.match(original):
            self.done = True
            return self.rewrite(updated)
        return updated


class _CallEdit(cst.CSTTransformer):
    """Rewrite the argument list of the first call whose callee matches ``callee`` (or the call number
    ``occurrence`` among the matching ones, counted in source order)."""

    def __init__(self, callee: Callable[[str], bool], rewrite_args: Callable[[list[cst.Arg]], list[cst.Arg] | None],
                 occurrence: int | None = None) -> None:
        self.callee, self.rewrite_args, self.done = callee, rewrite_args, False
        self.occurrence: int | None
        self.order: dict[int, int]  # id(call) -> its number among the matching calls
        self.occurrence, self.order = occurrence, {}

    def visit_Call(self, node: cst.Call) -> None:
        if self.callee(_code(node.func)):
            self.order[id(node)] = len(self.order)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if self.done or not self.callee(_code(original.func)):
            return updated
        if self.occurrence is not None and self.order.get(id(original)) != self.occurrence:
            return updated
        args = self.rewrite_args(list(updated.args))
        if args is None:
            return updated
        self.done = True
        return updated.with_changes(args=args)


def _callee_matcher(call: str | None) -> Callable[[str], bool]:
    """``"backward"`` matches ``loss.backward``; ``"ReLU"`` matches ``nn.ReLU``; an exact callee matches itself."""
    def match(code: str) -> bool:
        if not call:
            return True
        code = "".join(code.split())
        return code == call or code.endswith("." + call)
    return match


def _within(statement: cst.SimpleStatementLine, transformer: _CallEdit, what: str) -> cst.SimpleStatementLine:
    edited = statement.visit(transformer)
    if not transformer.done:
        raise EditNotApplicable(f"{what} not found in `{_code(statement).strip()}`")
    return edited  # type: ignore[return-value]  # a call's arguments rewritten: never the statement removed


def _single(statement: cst.SimpleStatementLine) -> cst.BaseSmallStatement:
    if len(statement.body) != 1:
        raise EditNotApplicable(f"expected one statement on the line, got `{_code(statement).strip()}`")
    return statement.body[0]


def _assignment_value(statement: cst.SimpleStatementLine, method: str, target: str | None) -> cst.SimpleStatementLine:
    small = _single(statement)
    if not isinstance(small, (cst.Assign, cst.AnnAssign)) or small.value is None:
        raise EditNotApplicable(f"expected an assignment, got `{_code(statement).strip()}`")
    if target and isinstance(small, cst.Assign):
        targets = [_code(t.target) for t in small.targets]
        if not any(_same(t, target) for t in targets):
            raise EditNotApplicable(f"`{_code(statement).strip()}` does not assign `{target}`")
    value = small.value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == method:
        raise EditNotApplicable(f"the value is already `.{method}()`ed")
    return statement.with_changes(body=[small.with_changes(value=_method(value, method))])


def _rebind_slice_target(statement: cst.SimpleStatementLine, target: str | None) -> cst.SimpleStatementLine:
    """``self.obs[:], r = step()`` -> ``self.obs, r = step()`` (the target ``self.obs``, a full slice)."""
    small = _single(statement)
    if not isinstance(small, cst.Assign):
        raise EditNotApplicable(f"expected an assignment, got `{_code(statement).strip()}`")

    def full_slice_of_target(node: cst.BaseExpression) -> bool:
        if not isinstance(node, cst.Subscript) or not _same(_code(node.value), target) or len(node.slice) != 1:
            return False
        index = node.slice[0].slice
        return isinstance(index, cst.Slice) and index.lower is None and index.upper is None and index.step is None

    edit = _ExpressionEdit(full_slice_of_target, lambda node: node.value)
    targets = [t.visit(edit) for t in small.targets]
    if not edit.done:
        raise EditNotApplicable(f"`{target}[:]` is not assigned in `{_code(statement).strip()}`")
    return statement.with_changes(body=[small.with_changes(targets=targets)])


# Binding strength of binary operators (higher binds tighter), for `x op= y` -> `x = x op y`.
_STRENGTH = {
    cst.BitOr: 1, cst.BitXor: 2, cst.BitAnd: 3, cst.LeftShift: 4, cst.RightShift: 4, cst.Add: 5, cst.Subtract: 5,
    cst.Multiply: 6, cst.Divide: 6, cst.FloorDivide: 6, cst.Modulo: 6, cst.MatrixMultiply: 6, cst.Power: 8,
}


def _right_operand(value: cst.BaseExpression, operator: cst.BaseBinaryOp) -> cst.BaseExpression:
    """``value`` as the right operand of ``x operator value``: parenthesized unless it binds tighter."""
    if isinstance(value, cst.BinaryOperation) and not value.lpar and type(operator) is not cst.Power and (
            _STRENGTH.get(type(value.operator), 0) > _STRENGTH.get(type(operator), 9)):
        return value
    return _atom(value)


def _augmented_to_binary(statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    small = _single(statement)
    if not isinstance(small, cst.AugAssign) or type(small.operator) not in _AUG_TO_BINARY:
        raise EditNotApplicable(f"expected an augmented assignment (x += y), got `{_code(statement).strip()}`")
    operator = _AUG_TO_BINARY[type(small.operator)]()
    binary = cst.BinaryOperation(left=small.target.deep_clone(), operator=operator,
                                 right=_right_operand(small.value, operator))
    return statement.with_changes(body=[cst.Assign(targets=[cst.AssignTarget(target=small.target)], value=binary)])


def _is_inplace_method(node: cst.CSTNode) -> TypeGuard[_InplaceCall]:
    """``x.add_(...)``: a call of a method whose name ends in one underscore (``__setitem__`` is not one)."""
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)):
        return False
    name = node.func.attr.value
    return name.endswith("_") and not name.endswith("__")


def _strip_inplace_links(call: cst.Call) -> tuple[cst.Call, cst.BaseExpression] | None:
    """``c.mul_(s).add_(m)`` -> (``c.mul(s).add(m)``, receiver ``c``); None when it is not such a chain.
    Raises EditNotApplicable for a link with no out-of-place method (``normal_``; see out_of_place_method)."""
    links: list[_InplaceCall] = []
    node: cst.BaseExpression = call
    while _is_inplace_method(node):
        links.append(node)
        node = node.func.value
    if not links:
        return None
    receiver = node
    for link in links:
        if not _flag_off(link) and out_of_place_method(link.func.attr.value) is None:
            raise EditNotApplicable(f"`.{link.func.attr.value}()` has no out-of-place method; write into a clone "
                                    f"instead")

    stripped: cst.BaseExpression = receiver
    for link in reversed(links):  # innermost first: each link rebuilt on the one it calls, its `_` dropped
        name = cst.Name("detach" if _flag_off(link) else link.func.attr.value[:-1])
        stripped = link.with_changes(func=link.func.with_changes(value=stripped, attr=name),
                                     args=[] if _flag_off(link) else link.args)
    return stripped, receiver  # type: ignore[return-value]  # the outermost link rebuilt: a call


def _flag_off(link: cst.Call) -> bool:
    """``x.requires_grad_(False)``: switching autograd off in place. Its out-of-place form is ``x.detach()`` (the
    same values, no graph), which is what PyTorch asks for when ``x`` is not a leaf."""
    return (isinstance(link.func, cst.Attribute) and link.func.attr.value == "requires_grad_" and len(link.args) == 1
            and _code(link.args[0].value) == "False")


_SCOPES = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.Lambda)  # names bound only inside


class _FirstInplaceChain(cst.CSTVisitor):
    """The outermost in-place method chain of a statement, and whether it sits in a comprehension or a lambda
    (whose names do not exist outside it)."""

    def __init__(self) -> None:
        self.found: cst.Call | None = None
        self.scoped = False
        self._depth = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.found is not None:
            return False
        if isinstance(node, _SCOPES):
            self._depth += 1
        if _is_inplace_method(node):
            self.found, self.scoped = node, self._depth > 0
            return False
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if isinstance(original_node, _SCOPES):
            self._depth -= 1


def _assign(target: cst.BaseExpression, value: cst.BaseExpression) -> cst.Assign:
    # target: a name, an attribute or a subscript (an expression assigned to, as the user wrote it)
    return cst.Assign(targets=[cst.AssignTarget(target.deep_clone())], value=value)  # type: ignore[arg-type]


def _method_out_of_place(statement: cst.SimpleStatementLine, small: cst.BaseSmallStatement, stands: bool
                         ) -> cst.SimpleStatementLine | list[cst.BaseStatement]:
    """``x.div_(n)`` -> ``x = x.div(n)``; ``y = x.div_(n)`` (the result used) -> ``x = x.div(n)`` then ``y = x``;
    an in-place call inside an expression is hoisted the same way (``a - t.mul_(k)``: ``t = t.mul(k)`` first).

    # NOTE [An in-place call whose receiver cannot be rebound]
    # A receiver that is no name or attribute (``hx[idx].squeeze_(0)``: rebinding ``hx[idx]`` would write into
    # ``hx``, or fail on a tuple) or that lives in a comprehension or a lambda (``[h.relu_() for h in hs]``: ``h``
    # exists only there) cannot always be rebound before the statement. A scoped one never can: when the statement
    # uses the call's value, the call is made out of place where it stands (the expression gets the same values,
    # the receiver is left as it was). Whether a subscript can be rebound is a fact of the running program (a list
    # element can, a tuple's cannot, a tensor's row is written in place again): it is rebound, as the program's
    # later reads of it expect, and ``stands`` asks for the other form, which ``gradguard fix`` tries next when the
    # run that verifies the first says it does not hold. A call whose value is not used is always rebound: made
    # out of place where it stands, it would do nothing."""
    finder = _FirstInplaceChain()
    small.visit(finder)
    chain = finder.found
    if chain is None:
        raise EditNotApplicable(f"no in-place method call in `{_code(statement).strip()}`")
    new, receiver = _strip_inplace_links(chain)  # type: ignore[misc]  # chain is an in-place chain: not None
    # the call's value goes nowhere: the statement is the call, or a comprehension of it (`[h.relu_() for h in hs]`)
    whole = isinstance(small, cst.Expr) and chain in (small.value, getattr(small.value, "elt", None))
    rebindable = (cst.Name, cst.Attribute) if stands and not whole else (cst.Name, cst.Attribute, cst.Subscript)
    if finder.scoped or not isinstance(receiver, rebindable):
        if whole:
            raise EditNotApplicable(f"`{_code(receiver)}` cannot be rebound and the call's value is not used in "
                                    f"`{_code(statement).strip()}`")
        return statement.with_changes(body=[small.visit(_ExpressionEdit(lambda node: node is chain,
                                                                        lambda node: new))])
    rebind = statement.with_changes(body=[_assign(receiver, new)])
    if whole:
        return rebind
    edit = _ExpressionEdit(lambda node: node is chain, lambda node: receiver.deep_clone())
    rest = small.visit(edit)
    if (isinstance(rest, cst.Assign) and len(rest.targets) == 1 and _same(_code(rest.targets[0].target), _code(receiver))
            and _same(_code(rest.value), _code(receiver))):
        return rebind  # `x = x.div_(n)`: the rebinding is the whole statement
    return [rebind.with_changes(trailing_whitespace=cst.TrailingWhitespace()),  # the comment stays on its line
            statement.with_changes(body=[rest], leading_lines=[])]


def _masked_fill(statement: cst.SimpleStatementLine, small: cst.BaseSmallStatement) -> cst.SimpleStatementLine:
    """``x[mask] = v`` -> ``x = x.masked_fill(mask, v)``."""
    if not (isinstance(small, cst.Assign) and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Subscript)
            and len(small.targets[0].target.slice) == 1
            and isinstance(small.targets[0].target.slice[0].slice, cst.Index)):  # not a slice: x[a:b] = v
        raise EditNotApplicable(f"expected a mask assignment x[mask] = v, got `{_code(statement).strip()}`")
    subscript = small.targets[0].target
    index = subscript.slice[0].slice
    assert isinstance(index, cst.Index)  # checked above; for the type checker
    base, mask = subscript.value, index.value
    masked = cst.Call(func=cst.Attribute(value=_atom(base), attr=cst.Name("masked_fill")),
                      args=[cst.Arg(mask, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                            cst.Arg(small.value)])
    return statement.with_changes(body=[_assign(base, masked)])


def _passes_inplace(call: cst.Call) -> bool:
    return any(a.keyword is not None and a.keyword.value == "inplace" for a in call.args)


def _namespace_out_of_place(statement: cst.SimpleStatementLine, call: cst.Call, namespace: cst.Name,
                            name: str) -> cst.SimpleStatementLine:
    """torch.relu_(x) -> x = torch.relu(x); F.relu(x, inplace=True) -> x = F.relu(x)"""
    target = call.args[0].value
    if _passes_inplace(call):
        dropped = _edit_keyword(cst.SimpleStatementLine([cst.Expr(call)]), {"keyword": "inplace", "value": None})
        # the Expr built here
        return statement.with_changes(body=[_assign(target, _single(dropped).value)])  # type: ignore[attr-defined]
    if not name.endswith("_") or name.endswith("__"):
        raise EditNotApplicable(f"`{_code(call)}` is not an in-place call")
    if out_of_place_method(name, namespace=True) is None:
        raise EditNotApplicable(f"`{namespace.value}.{name}` has no out-of-place function")
    new = call.with_changes(func=call.func.with_changes(attr=cst.Name(name[:-1])))
    return statement.with_changes(body=[_assign(target, new)])


def _out_of_place(statement: cst.SimpleStatementLine, detail: dict[str, Any]
                  ) -> cst.SimpleStatementLine | list[cst.BaseStatement]:
    small = _single(statement)
    if detail.get("method") == "masked_fill":
        return _masked_fill(statement, small)
    if isinstance(small, cst.AugAssign):
        return _augmented_to_binary(statement)
    rebound = _rebound(statement, small, detail)
    if rebound is not None:
        return statement.with_changes(body=[rebound])
    call = small.value if isinstance(small, cst.Expr) else None
    if (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name)
            and call.func.value.value in ("torch", "F") and call.args):
        return _namespace_out_of_place(statement, call, call.func.value, call.func.attr.value)
    if isinstance(small, cst.Assign) and isinstance(small.value, cst.Call) and _passes_inplace(small.value):
        return _edit_keyword(statement, {"keyword": "inplace", "value": None})
    if isinstance(small, (cst.Expr, cst.Assign, cst.AnnAssign, cst.Return)):
        return _method_out_of_place(statement, small, bool(detail.get("stands")))
    raise EditNotApplicable(f"no in-place call to rewrite in `{_code(statement).strip()}`")


def _rebound(statement: cst.SimpleStatementLine, small: cst.BaseSmallStatement, detail: dict[str, Any]
             ) -> cst.BaseSmallStatement | None:
    """The writes that are no in-place method: ``out=`` (assigned, or ``copy_`` with ``detail["out"] == "copy"``)
    and ``x.requires_grad = False`` (``x = x.detach()``, as ``requires_grad_(False)``; ``= True`` on a computed
    tensor, which requires grad already: ``x.retain_grad()``); None for the others."""
    if detail.get("out") == "copy":
        return _out_copied(statement, small)
    if (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(flag := small.targets[0].target,
                                                                                  cst.Attribute)
            and flag.attr.value == "requires_grad" and _code(small.value) in ("False", "True")):
        if _code(small.value) == "True":  # it already requires grad: what the flag was set for is its .grad
            return cst.Expr(_method(flag.value, "retain_grad"))
        return _assign(flag.value, _method(flag.value, "detach"))
    if isinstance(small, (cst.Expr, cst.Assign)) and isinstance(small.value, cst.Call) and (
            out := _out_argument(small.value)) is not None:
        return _without_out(small, small.value, out)
    return None


def _out_argument(call: cst.Call) -> int | None:
    """The position of the call's ``out=`` argument (the tensor it writes), or None."""
    return next((i for i, arg in enumerate(call.args) if arg.keyword is not None and arg.keyword.value == "out"), None)


def _out_copied(statement: cst.SimpleStatementLine, small: cst.BaseSmallStatement) -> cst.BaseSmallStatement:
    """``torch.arange(n, out=w).mul_(s)`` -> ``w.copy_(torch.arange(n)).mul_(s)``: the same tensor object written
    and returned (a parameter stays one; a factory's ``out=`` would also clear its requires_grad)."""
    def copied(call: cst.Call) -> cst.Call:
        out = cast(int, _out_argument(call))
        value = call.with_changes(args=_drop_arg(list(call.args), out))
        return cst.Call(func=cst.Attribute(value=_atom(call.args[out].value), attr=cst.Name("copy_")),
                        args=[cst.Arg(value)])

    edit = _ExpressionEdit(lambda node: isinstance(node, cst.Call) and _out_argument(node) is not None, copied)
    edited = small.visit(edit)
    if not edit.done:
        raise EditNotApplicable(f"no `out=` argument in `{_code(statement).strip()}`")
    return cast(cst.BaseSmallStatement, edited)  # a call replaced: still the statement


def _without_out(small: cst.Expr | cst.Assign, call: cst.Call, out: int) -> cst.Assign:
    """``torch.mul(y, 2, out=y)`` -> ``y = torch.mul(y, 2)``; ``z = f(x, out=b)`` -> ``z = b = f(x)``."""
    target, value = call.args[out].value, call.with_changes(args=_drop_arg(list(call.args), out))
    if not isinstance(target, (cst.Name, cst.Attribute, cst.Subscript, cst.Tuple, cst.List)):
        raise EditNotApplicable(f"`out={_code(target)}` cannot be assigned to")
    targets = list(small.targets) if isinstance(small, cst.Assign) else []
    return cst.Assign(targets=[*targets, cst.AssignTarget(target)], value=value)


def _drop_arg(args: list[cst.Arg], index: int) -> list[cst.Arg]:
    kept = args[:index] + args[index + 1:]
    if kept and index == len(args) - 1:  # the new last argument takes the removed one's trailing comma
        kept[-1] = kept[-1].with_changes(comma=args[index].comma)
    return kept


def _edit_keyword(statement: cst.SimpleStatementLine, detail: dict[str, Any]) -> cst.SimpleStatementLine:
    """Set keyword ``detail["keyword"]`` of call ``detail["call"]`` to ``detail["value"]``; None removes it.
    ``detail["position"]``: where the parameter sits when it is passed positionally instead; ``detail["add"]``:
    add the keyword when the call does not pass it."""
    keyword, value = detail["keyword"], detail.get("value")

    def rewrite(args: list[cst.Arg]) -> list[cst.Arg] | None:
        for index, arg in enumerate(args):
            if arg.keyword is not None and arg.keyword.value == keyword:
                if value is None:
                    return _drop_arg(args, index)
                return args[:index] + [arg.with_changes(value=cst.parse_expression(repr(value)))] + args[index + 1:]
        position = detail.get("position")  # the keyword passed positionally: `nn.ReLU(True)`
        if value is not None and position is not None and position < len(args) and not any(
                a.keyword is not None or a.star for a in args[:position + 1]):
            arg = args[position]
            return args[:position] + [arg.with_changes(value=cst.parse_expression(repr(value)))] + args[position + 1:]
        if value is not None and detail.get("add"):  # `MLP(3, [3, 3])` -> `MLP(3, [3, 3], inplace=False)`
            added = cst.Arg(cst.parse_expression(repr(value)), keyword=cst.Name(keyword),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
            if not args:
                return [added]
            last = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            return [*args[:-1], last, added.with_changes(comma=args[-1].comma)]
        return None

    edited = _within(statement, _CallEdit(_callee_matcher(detail.get("call")), rewrite, detail.get("occurrence")),
                     f"a call{' of ' + detail['call'] if detail.get('call') else ''} with keyword {keyword}=")
    return _keep_written_value(edited) if keyword == "inplace" and not value else edited


def _keep_written_value(statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    """``F.relu(h, inplace=False)`` standing alone -> ``h = F.relu(h, inplace=False)``: a call whose value nobody
    used acted only by writing its first argument; made out of place, its value takes the argument's place."""
    small = statement.body[0] if len(statement.body) == 1 else None
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and small.value.args):
        return statement
    first = small.value.args[0]
    if first.keyword is not None or first.star or not _is_plain_reference(first.value):
        return statement
    return statement.with_changes(body=[_assign(first.value, small.value)])


def _edit_argument(statement: cst.SimpleStatementLine, intent: FixIntent, method: str) -> cst.SimpleStatementLine:
    def rewrite(args: list[cst.Arg]) -> list[cst.Arg] | None:
        for index, arg in enumerate(args):
            if _same(_code(arg.value), intent.target):
                return args[:index] + [arg.with_changes(value=_method(arg.value, method))] + args[index + 1:]
        return None

    call = intent.detail.get("call")
    return _within(statement, _CallEdit(_callee_matcher(call), rewrite),
                   f"the argument `{intent.target}`{' of ' + call if call else ''}")


def _clone_expression(statement: cst.SimpleStatementLine, intent: FixIntent,
                      method: str = "clone") -> cst.SimpleStatementLine:
    """``target`` (or each of ``detail["targets"]``) inside the statement wrapped as ``target.method()``, or as
    ``tuple(s.method() for s in target)`` with ``detail["each"]`` (a tuple of tensors, an LSTM's state)."""
    small = _single(statement)
    scope = small.value if isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Expr, cst.Return)) else None
    if scope is None:
        raise EditNotApplicable(f"expected an assignment or an expression, got `{_code(statement).strip()}`")
    each = bool(intent.detail.get("each"))

    def wrap(node: cst.BaseExpression) -> cst.BaseExpression:
        if "with" in intent.detail:  # replace_expression
            return cst.parse_expression(intent.detail["with"])
        if each:
            return cst.parse_expression(f"tuple(s.{method}() for s in {_code(_atom(node))})")
        return _method(node, method)

    for target in intent.detail.get("targets") or [intent.target]:
        edit = _ExpressionEdit(lambda node: _same(_code(node), target), wrap)  # used in this iteration only
        scope = cast(cst.BaseExpression, scope.visit(edit))  # an expression rewritten is still an expression
        if not edit.done:
            raise EditNotApplicable(f"`{target}` not found in `{_code(statement).strip()}`")
    return statement.with_changes(body=[small.with_changes(value=scope)])


def _wrap_no_grad(statement: cst.SimpleStatementLine, detail: dict[str, Any]) -> cst.With:
    manager = detail.get("context") or "torch.no_grad()"
    small = _single(statement)
    if "replace" in detail:  # `w.data.add_(g)` -> `w.add_(g)` under no_grad
        suffix = detail["replace"]
        edit = _ExpressionEdit(lambda node: isinstance(node, cst.Attribute) and "." + node.attr.value == suffix,
                               lambda node: node.value)
        small = small.visit(edit)  # type: ignore[assignment]  # an attribute replaced: still the statement
        if not edit.done:
            raise EditNotApplicable(f"`{suffix}` not found in `{_code(statement).strip()}`")
    if detail.get("out") == "copy":
        small = _out_copied(statement, small)
    inner = statement.with_changes(body=[small], leading_lines=[])
    return cst.With(items=[cst.WithItem(cst.parse_expression(manager))], body=cst.IndentedBlock(body=[inner]),
                    leading_lines=statement.leading_lines)


def _is_plain_reference(expression: cst.BaseExpression) -> bool:
    """A name, attribute or subscript with constant/name indices: evaluating it again has no effect."""
    import ast

    try:
        tree = ast.parse(_code(expression), mode="eval")
    except SyntaxError:
        return False
    allowed = (ast.Expression, ast.Name, ast.Attribute, ast.Subscript, ast.Constant, ast.Load, ast.Tuple, ast.Slice,
               ast.UnaryOp, ast.USub)
    return all(isinstance(node, allowed) for node in ast.walk(tree))


def _index_loop_variable(statement: cst.BaseStatement, target: str | None, index: str) -> cst.For:
    """``for x in t:`` -> ``for i, x in enumerate(t):`` with ``x = t[i]`` first in the body (see ACTIONS)."""
    if not isinstance(statement, cst.For) or target is None:
        raise EditNotApplicable(f"index_loop_variable edits a for loop over `{target}`")
    loop_target, iterated = statement.target, None
    if isinstance(loop_target, cst.Name) and loop_target.value == target:
        iterated = statement.iter
    elif isinstance(loop_target, cst.Tuple) and isinstance(statement.iter, cst.Call) and _code(statement.iter.func) == "zip":
        names = [e.value.value if isinstance(e.value, cst.Name) else None for e in loop_target.elements]
        args = statement.iter.args
        if target in names and len(args) == len(names) and not any(a.star or a.keyword for a in args):
            iterated = args[names.index(target)].value
    if iterated is None or not _is_plain_reference(iterated):
        raise EditNotApplicable(f"the loop does not bind `{target}` to the pieces of a plain tensor expression")
    inner = loop_target.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if isinstance(loop_target, cst.Tuple) else loop_target
    new_target = cst.Tuple([cst.Element(cst.Name(index)), cst.Element(inner)], lpar=[], rpar=[])
    new_iter = cst.Call(cst.Name("enumerate"), [cst.Arg(statement.iter)])
    rebind = _statements(f"{target} = {_code(_atom(iterated))}[{index}]")[0]
    body = statement.body
    return statement.with_changes(target=new_target, iter=new_iter, body=body.with_changes(body=[rebind, *body.body]))


def apply_intent(source: str, intent: FixIntent) -> str:
    """``source`` with ``intent`` applied; EditNotApplicable when it does not fit the source."""
    return apply_intents(source, [intent])


def apply_intents(source: str, intents: list[FixIntent]) -> str:
    """``source`` with every intent applied (all of them name lines of this one source, as it is now)."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        raise EditNotApplicable(f"the file does not parse: {error}") from error
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    lines = [n for intent in intents for n in (intent.line, intent.detail.get("after_line")) if n]
    locate = _Locate(*lines)
    wrapper.visit(locate)
    changes: dict[int, _Replacement] = {}
    after: dict[int, list[cst.BaseStatement]] = {}  # id(statement) -> statements to put after it (moves)
    for intent in intents:
        statement = locate.found.get(intent.line)
        if statement is None:
            raise EditNotApplicable(f"no simple statement at line {intent.line}")
        current = changes.get(id(statement), statement)
        if isinstance(current, (list, type(None))):
            raise EditNotApplicable(f"two edits of the statement at line {intent.line}")
        if not isinstance(current, cst.SimpleStatementLine) and intent.action not in _STATEMENT_ACTIONS:
            raise EditNotApplicable(f"line {intent.line} is the header of a compound statement; "
                                    f"{intent.action} edits simple statements")
        # a compound statement (checked above) reaches only the _STATEMENT_ACTIONS, which take any statement
        changes[id(statement)] = _apply_one(current, intent, locate, after)  # type: ignore[arg-type]
    lookup = {id(s): s for s in locate.found.values()}  # every edited statement was found here, by its line
    for key, extra in after.items():
        current = changes.get(key)
        base = current if current is not None else lookup[key]
        changes[key] = [*(base if isinstance(base, list) else [base]), *extra]
    return module.visit(_Replace(changes)).code


_STATEMENT_ACTIONS = ("insert_before", "insert_after", "move_statement", "index_loop_variable", "run_unconditionally")


def _remove_statement(statement: cst.SimpleStatementLine, intent: FixIntent, locate: _Locate,
                      after: dict[int, list[cst.BaseStatement]]) -> _Replacement:
    written = "; ".join(_code(n) for n in statement.body)
    if intent.target is not None and not _same(written, intent.target):
        raise EditNotApplicable(f"line {intent.line} reads {written!r}, not {intent.target!r}")
    return None


def _insert(statement: cst.SimpleStatementLine, intent: FixIntent, locate: _Locate,
            after: dict[int, list[cst.BaseStatement]]) -> _Replacement:
    action, detail = intent.action, intent.detail
    code = detail.get("code") or detail.get("statement")
    if not code:
        raise EditNotApplicable(f"{action} needs detail['code']")
    new = _statements(code)
    if action == "insert_before":
        moved = statement.with_changes(leading_lines=[])
        return [new[0].with_changes(leading_lines=statement.leading_lines), *new[1:], moved]
    return [statement, *new]


def _move_statement(statement: cst.SimpleStatementLine, intent: FixIntent, locate: _Locate,
                    after: dict[int, list[cst.BaseStatement]]) -> _Replacement:
    detail = intent.detail
    destination = locate.found.get(detail.get("after_line"))
    if destination is None:
        raise EditNotApplicable(f"no statement at line {detail.get('after_line')} to move after")
    if destination is statement:
        raise EditNotApplicable("a statement cannot move after itself")
    if locate.next_is_same(detail["after_line"], intent.line):
        return None  # `opt.step()` moved next to the same `opt.step()`: once per iteration, not twice
    after.setdefault(id(destination), []).append(statement.with_changes(leading_lines=[]))
    return None


def _run_unconditionally(statement: cst.BaseStatement, intent: FixIntent, locate: _Locate,
                         after: dict[int, list[cst.BaseStatement]]) -> _Replacement:
    """``if self.cache is None:`` + its block -> the block: what ran once now runs every time."""
    if not isinstance(statement, cst.If) or statement.orelse is not None \
            or not isinstance(statement.body, cst.IndentedBlock):
        raise EditNotApplicable(f"line {intent.line} is no `if` without an else")
    test = intent.detail.get("test")
    if test is not None and not _same(_code(statement.test), test):
        raise EditNotApplicable(f"the `if` at line {intent.line} tests `{_code(statement.test)}`, not `{test}`")
    first, *rest = statement.body.body
    if isinstance(first, (cst.SimpleStatementLine, cst.If, cst.For, cst.While, cst.With, cst.Try)):
        first = first.with_changes(leading_lines=[*statement.leading_lines, *first.leading_lines])
    return [first, *rest]


_EDITS: dict[str, _Edit] = {
    "detach_assignment": lambda statement, intent, *_: _assignment_value(statement, "detach", intent.target),
    "clone_assignment": lambda statement, intent, *_: _assignment_value(statement, "clone", intent.target),
    "detach_argument": lambda statement, intent, *_: _edit_argument(statement, intent, "detach"),
    "clone_argument": lambda statement, intent, *_: _edit_argument(statement, intent, "clone"),
    "clone_expression": lambda statement, intent, *_: _clone_expression(statement, intent),
    "detach_expression": lambda statement, intent, *_: _clone_expression(statement, intent, "detach"),
    "replace_expression": lambda statement, intent, *_: _clone_expression(statement, intent),
    "drop_keyword": lambda statement, intent, *_: _edit_keyword(statement, {**intent.detail, "value": None}),
    "set_keyword": lambda statement, intent, *_: _edit_keyword(statement, intent.detail),
    "augmented_to_binary": lambda statement, *_: _augmented_to_binary(statement),
    "inplace_to_out_of_place": lambda statement, intent, *_: _out_of_place(statement, intent.detail),
    "wrap_no_grad": lambda statement, intent, *_: _wrap_no_grad(statement, intent.detail),
    "rebind_slice_target": lambda statement, intent, *_: _rebind_slice_target(statement, intent.target),
    "remove_statement": _remove_statement,
    "insert_before": _insert,
    "insert_after": _insert,
    "index_loop_variable": lambda statement, intent, *_: _index_loop_variable(
        statement, intent.target, intent.detail.get("index") or "i"),
    "move_statement": _move_statement,
    "run_unconditionally": _run_unconditionally,
}


def _apply_one(statement: cst.SimpleStatementLine, intent: FixIntent, locate: _Locate,
               after: dict[int, list[cst.BaseStatement]]) -> _Replacement:
    edit = _EDITS.get(intent.action)
    if edit is None:
        raise EditNotApplicable(f"no edit for action {intent.action!r}")
    return edit(statement, intent, locate, after)
