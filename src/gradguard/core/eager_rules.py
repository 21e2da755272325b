"""The rule rows for the errors PyTorch raises at once: an in-place write autograd refuses (a leaf, a view of a
leaf, one of several views, a view made under no_grad, a custom Function's view) and a backward through a graph
an earlier backward freed. The torch probe (backends/torch/eager.py) gathers the facts (``Facts.eager_check``,
``written``, ``carried``, ``crossing`` ...); these rows turn them into the verdict. ``diagnosis.RULES`` calls them
as ``E.name``. Paddle refuses a leaf's write too: paddle's probe (backends/paddle/eager.py) gives the leaf row the
same facts and its own words for it (``leaf_words``)."""

from __future__ import annotations

import ast
import dataclasses
import linecache
from typing import Callable

from .facts import CrossingTensor
from .findings import Finding, SourceLocation
from .fixes import assigned_names, items_copied_before_loop, mask_assignment, out_of_place, statement_code
from .intents import FixIntent, Verdict
from .module_sites import split_module_via
from .source_ast import bodies_with_line, container_entries, parse_code, parse_file, parse_statement

__all__ = ["check", "leaf_rule", "out_argument_rule", "cut_in_place_rule", "view_of_leaf_rule", "multi_view_rule",
           "no_grad_view_rule", "function_view_rule", "carried_rule", "same_loss_rule", "hoisted_rule", "crossing_rule",
           "accumulated_rule", "running_sum_rule", "unknown_twice_rule", "no_graph_rule", "non_leaf_grad_rule",
           "non_leaf_param_rule", "grad_not_required_rule"]


def check(name: str) -> Callable[[Finding], bool | None]:
    """``when`` for the row of one of PyTorch's eager checks (``Facts.eager_check``)."""
    return lambda f: True if f.facts.eager_check == name else None


# -- an in-place write PyTorch refuses ---------------------------------------------------------------------------

def _write_at(f: Finding) -> SourceLocation | None:
    return f.modified_at[0].location if f.modified_at else None


def _one_line(made: SourceLocation) -> str:
    """The statement at ``made``; one over several lines (``hx = (`` ...) all of it, on one line."""
    code = statement_code(made)
    if code == made.code:
        return code
    tree = parse_code(code)
    return made.code if tree is None else ast.unparse(tree)


def _created_at(f: Finding) -> list[tuple[str, str]]:
    made = f.facts.made_at
    if made is not None:
        return [("created at", f"{made.short}: {_one_line(made)}")]
    if f.tensor.role == "parameter":
        return [("created at", "a module parameter (leaf tensor created by nn.Module)")]
    return []


def _binding_loops(at: SourceLocation | None,
                   written: str | None) -> tuple[ast.Module | None, list[ast.For | ast.AsyncFor]]:
    """(tree, loops): the ``for`` loops around the write whose target binds the written name, innermost last;
    tree None when the file does not parse (then nobody can tell)."""
    if at is None or not written or not linecache.getlines(at.file):
        return ast.Module(body=[], type_ignores=[]), []  # no source: no loop
    tree = parse_file(at.file)
    if tree is None:
        return None, []
    base = written.split("[", 1)[0].split(".", 1)[0]
    loops = [node for node in ast.walk(tree) if isinstance(node, (ast.For, ast.AsyncFor))
             and node.lineno < at.line <= (node.end_lineno or node.lineno)
             and base in {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}]
    return tree, sorted(loops, key=lambda node: node.lineno)


def _module_wrote(f: Finding) -> str | None:
    """``net.1 (ReLU)``: the in-place module that made the refused write inside torch's code, when the probe named
    it (the write's ``via``: ``net.1 (ReLU(inplace=True))``)."""
    found = split_module_via(f.modified_at[0].via) if f.modified_at else None
    if found is None:
        return None
    path, kind = found
    return f"`{path}` ({kind})" if path else f"a {kind}"


def _is_loop_target(at: SourceLocation | None, written: str | None) -> bool:
    """Whether the written name is bound by an enclosing ``for`` (a view the loop hands out piece by piece)."""
    tree, loops = _binding_loops(at, written)
    return tree is None or bool(loops)  # a file that does not parse: cannot tell, so do not propose a rebinding


def _rewrite_intents(at: SourceLocation | None, written: str | None, reason: str,
                     preferred: bool = True) -> list[FixIntent]:
    """The write rewritten out of place (``x += y``, ``x.mul_(s)``, ``x[m] = v``), as an intent; none when the
    statement has no out-of-place form, or when it writes a loop variable (rebinding that name would drop the
    write the loop meant to make, e.g. ``for c in t.unbind(): c.mul_(s)``)."""
    if at is None or not at.code or _is_loop_target(at, written):
        return []
    code = statement_code(at)
    stmt = parse_statement(code)
    if stmt is None:
        return []
    if isinstance(stmt, ast.AugAssign):
        action, detail = "augmented_to_binary", {}
    elif mask_assignment(code):
        action, detail = "inplace_to_out_of_place", {"method": "masked_fill"}
    elif out_of_place(code):
        action, detail = "inplace_to_out_of_place", {}
    else:
        return []
    return [FixIntent(action, at.file, at.line, target=written, detail=detail, reason=reason, preferred=preferred)]


def _clone_before_intent(at: SourceLocation | None, written: str | None, preferred: bool) -> list[FixIntent]:
    """``name = name.clone()`` inserted before the write: the write then changes a copy."""
    if at is None or not written or not written.isidentifier() or _is_loop_target(at, written):
        return []
    return [FixIntent("insert_before", at.file, at.line, target=written,
                      detail={"code": f"{written} = {written}.clone()"},
                      reason=f"the write then changes a copy of `{written}`", preferred=preferred)]


def _index_loop_intent(at: SourceLocation | None, written: str | None) -> list[FixIntent]:
    """The ``for`` that binds the written name, rewritten to hand out indexed views (``x = t[i]``)."""
    tree, loops = _binding_loops(at, written)
    if at is None or not written or tree is None or not loops or not isinstance(loops[-1], ast.For):
        return []  # an `async for` has no enumerate()
    name = written.split("[", 1)[0].split(".", 1)[0]
    used = ({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            | {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)})
    index = next(c for c in ("i", "index", "_i", "_index") + tuple(f"_i{k}" for k in range(100)) if c not in used)
    return [FixIntent("index_loop_variable", at.file, loops[-1].lineno, target=name, detail={"index": index},
                      reason=f"`{name}` becomes an indexed view of the tensor (`[{index}]`), which can be written in "
                             f"place; the write still reaches the tensor", preferred=True)]


def _preferred_first(fixes: list[FixIntent]) -> list[FixIntent]:
    """When no edit is preferred, the first alternative becomes the preferred one."""
    if fixes and not any(x.preferred for x in fixes):
        fixes[0] = dataclasses.replace(fixes[0], preferred=True)
    return fixes


def _no_grad_intent(at: SourceLocation | None, written: str | None, preferred: bool = True) -> list[FixIntent]:
    if at is None:
        return []
    return [FixIntent("wrap_no_grad", at.file, at.line, target=written,
                      reason="an update of the leaf itself: autograd must not record it", preferred=preferred)]


def leaf_rule(f: Finding, _: object) -> Verdict:
    if f.facts.leaf_words is not None:  # another framework's words (Paddle's probe): no edit, the edits write torch;
        why, fix = f.facts.leaf_words    # "created at" only for the line that made it (no nn.Module line)
        return Verdict("leaf_inplace", why, fix, display=_created_at(f) if f.facts.made_at is not None else [])
    at, written = _write_at(f), f.facts.written
    code, name = at.code if at else "", written or "the tensor"
    is_update = ".grad" in code or f.tensor.role == "parameter"
    if is_update:
        fix = (f"Make the update under no_grad, as optimizers do: `with torch.no_grad(): {code}` (the update is not "
               f"part of the model, so autograd must not record it).")
    else:
        out_of_place_code = (out_of_place(code) if code else None) or (f"{name} = {name} + 1" if written else None)
        compute = (f"write it out of place: `{out_of_place_code}`" if out_of_place_code
                   else "write the result to a new tensor instead of in place")
        fix = (f"If this computes a new value, {compute} (a new tensor; gradients still flow to the original "
               f"{name}). If it is meant to change the leaf itself (an update or initialisation), do it under "
               f"no_grad: `with torch.no_grad(): {code}`.")
    return Verdict(
        "leaf_inplace",
        f"`{name}` is a leaf tensor that requires grad (a parameter, or created with requires_grad=True): autograd "
        f"accumulates its gradient into `{name}.grad`. Writing it in place with grad mode on would make that "
        f"gradient refer to values that no longer exist, so PyTorch refuses the write.",
        fix,
        _no_grad_intent(at, written) if is_update else
        _rewrite_intents(at, written, f"a new tensor; gradients still flow to the original {name}")
        + _no_grad_intent(at, written, preferred=False),
        _created_at(f),
    )


def out_argument_rule(f: Finding, _: object) -> Verdict:
    """A call with ``out=`` while autograd records (``torch.mul(y, 2, out=y)``): not differentiable, so refused."""
    at, written = _write_at(f), f.facts.written
    code, name = at.code if at else "", written or "the tensor"
    leaf = f.kind == "leaf_inplace"
    why = (f"`{code}` writes its result into `{name}` through its out= argument. An op called with out= is not "
           f"differentiable, so PyTorch refuses it while any of its arguments requires grad"
           f"{f' (here `{name}` itself, a leaf tensor)' if leaf else ''}.")
    if leaf and at is not None:  # filled in place under no_grad: `out=` of a factory would clear requires_grad
        fill = FixIntent("wrap_no_grad", at.file, at.line, target=written, detail={"out": "copy"}, preferred=True,
                         reason=f"`{name}` filled under no_grad, as an initialisation is made; it stays a leaf that "
                                f"requires grad")
        copied = out_of_place(statement_code(at), copy_out=True) or code
        return Verdict("out_argument_with_grad", why,
                       f"`{name}` is a leaf that requires grad: fill it under no_grad, as an initialisation is made: "
                       f"`with torch.no_grad(): {copied}` (copy_ keeps it a leaf that requires grad; a factory "
                       f"called with out= would clear that flag).", [fill], _created_at(f))
    assigned = out_of_place(statement_code(at)) if at is not None else None
    return Verdict("out_argument_with_grad", why,
                   f"Assign the result instead of writing it into `{name}`: `{assigned}` (a new tensor, which "
                   f"autograd records)." if assigned else "Assign the result to a new tensor instead of passing out=.",
                   _rewrite_intents(at, written, "a new tensor, which autograd records"), _created_at(f))


def cut_in_place_rule(f: Finding, _: object) -> Verdict:
    """``v.detach_()`` on a view, ``y.requires_grad_(False)`` on a computed tensor: autograd's history cut in
    place, which PyTorch refuses; the out-of-place form (``y = y.detach()``) is what it asks for."""
    at, written = _write_at(f), f.facts.written
    code, name = at.code if at else "", written or "the tensor"
    if f.facts.eager_check == "detach_view":
        rule, why = "detach_view_inplace", (
            f"`{code}` detaches `{name}` in place, but `{name}` is a view of another tensor: detaching a view in "
            f"place would cut its base's autograd history too, so PyTorch refuses.")
    else:
        rule, why = "requires_grad_of_non_leaf", (
            f"`{code}` switches autograd off on `{name}` in place, but `{name}` was computed by autograd (it has a "
            f"grad_fn; only a leaf's flag can change): its history cannot be cut in place, so PyTorch refuses.")
    replaced = out_of_place(statement_code(at)) if at is not None else None
    if replaced is not None and replaced.endswith(".retain_grad()"):  # `x.requires_grad = True`
        why = (f"`{code}` sets autograd's flag on `{name}`, but `{name}` was computed by autograd: it requires grad "
               f"already (it has a grad_fn), and only a leaf's flag can be set, so PyTorch refuses. A computed "
               f"tensor gets no `.grad` unless asked for.")
        return Verdict(rule, why, f"To read `{name}.grad` after backward, ask autograd to keep it: `{replaced}`.",
                       _rewrite_intents(at, written, f"`{name}` keeps its gradient in `.grad` after backward"),
                       _created_at(f))
    fix = (f"Make a detached tensor instead: `{replaced}` (the same values without a graph: what is computed from "
           f"it is a constant to autograd)." if replaced else
           f"Use a detached tensor instead: `{name}.detach()` (the same values without a graph).")
    return Verdict(rule, why, fix, _rewrite_intents(at, written, "a detached tensor, made out of place"),
                   _created_at(f))


def view_of_leaf_rule(f: Finding, _: object) -> Verdict:
    at, written = _write_at(f), f.facts.written
    code, name = at.code if at else "", written or "the tensor"
    copy = (f"(`{name.split('.')[-1].split('[')[0]}2 = {name}.clone()` and index that)" if written
            else "(`.clone()` it and index the copy)")
    fix = (f"Initialise or update the leaf under no_grad: `with torch.no_grad(): {code}`. For a computation, write "
           f"into a copy instead {copy}.")
    if f.facts.owner_module == "Embedding" and f.tensor.role == "parameter":
        fix += (" To keep an embedding's padding row at zero, `nn.Embedding(..., padding_idx=0)` zeroes it and "
                "keeps its gradient at zero.")
    return Verdict(
        "view_of_leaf_inplace",
        f"`{code}` writes a view (index/slice) of `{name}`, a leaf tensor that requires grad; writing the view "
        f"writes the leaf, which autograd forbids with grad mode on.",
        fix, _no_grad_intent(at, written), _created_at(f),
    )


_MULTI_VIEW_FUNCTIONS = {"Split": "chunk()/split()", "SplitWithSizes": "split()", "Unbind": "unbind()"}


def multi_view_rule(f: Finding, _: object) -> Verdict:
    op = f.facts.view_op or "?"
    if op.endswith("Backward0"):  # torch 2.4 names the backward node ("UnbindBackward0"), later ones the op ("Unbind")
        op = op[: -len("Backward0")]
    function = _MULTI_VIEW_FUNCTIONS.get(op, op)
    at, written, made = _write_at(f), f.facts.written, f.facts.made_at
    code, name = at.code if at else "", written or "the tensor"
    loop_bound = _is_loop_target(at, written)
    clone = _clone_before_intent(at, written, preferred=False)  # the text offers only the edit there is
    copied = (items_copied_before_loop(at.file, at.line, written.split("[", 1)[0].split(".", 1)[0])
              if loop_bound and at is not None and written else None)
    if copied is not None:
        # the loop walks a container by name: its items can be copied before the loop, and the copies written
        fix = (f"`{name}` is the variable of a for loop over `{copied.target}`, whose items are views returned "
               f"together by {function}: rebinding `{name}` (out of place, or to a clone) would drop the write. Copy "
               f"the items before the loop (`{copied.detail['code']}`), so that the loop writes copies, which the "
               f"code then reads.")
    elif loop_bound:
        # Rebinding the loop variable (out of place, or to a clone) would silently drop the write the loop makes.
        fix = (f"`{name}` is the variable of a for loop over a tensor: iterating unbinds the tensor into views "
               f"that cannot be written in place one at a time, and rebinding `{name}` (out of place, or to a clone) "
               f"would leave the tensor unchanged. Index the tensor instead (`x[i]` is a view that can be written "
               f"in place: `for i in range(len(x)): x[i].mul_(s)`), or write the whole tensor at once. If no "
               f"gradient is needed through the result (an image to display), write into a detached copy "
               f"(`.detach().clone()`).")
    else:
        rewritten = out_of_place(code) if code else None
        fix = f"Write it out of place: `{rewritten}` instead of `{code}`." if rewritten else "Write it out of place."
        fix += (f" Or clone the piece before writing it (`{name} = {name}.clone()`)." if clone else
                " Or clone the piece before writing it, and write into the clone.")
        wrote = _module_wrote(f)
        if wrote:  # the write is the module's: nothing on the user's line to rewrite
            other = (f"Or clone the piece first (`{name} = {name}.clone()`)." if clone else
                     "Or pass it a clone of the piece.")
            fix = f"{wrote} wrote it in place: construct it with inplace=False. {other}"
    return Verdict(
        "multi_output_view_inplace",
        f"`{name}` is one of several views returned together by {function}"
        f"{f' (line {made.line}: `{_one_line(made)}`)' if made is not None else ''}. They share one backward node, "
        f"so autograd cannot record an in-place write into just one of them.",
        fix,
        _preferred_first([copied] if copied is not None else _index_loop_intent(at, written) if loop_bound else
                         _rewrite_intents(at, written, "a new tensor instead of a write into one of several views")
                         + clone),
        [("view of", f"{op} (several views returned by {function})"), *_created_at(f)],
    )


def _clone_assignment(code: str, method: str = "clone") -> str | None:
    """``first = hidden[:, :2]`` -> ``first = hidden[:, :2].clone()`` (or another method, e.g. detach)."""
    stmt = parse_statement(code)
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        value = ast.get_source_segment(code, stmt.value) or ast.unparse(stmt.value)
        if not isinstance(stmt.value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            value = f"({value})"
        return f"{ast.unparse(stmt.targets[0])} = {value}.{method}()"
    return None


def no_grad_view_rule(f: Finding, _: object) -> Verdict:
    at, written, made = _write_at(f), f.facts.written, f.facts.made_at
    code, name = at.code if at else "", written or "the tensor"
    copy = _clone_assignment(made.code) if made is not None else None
    where = f" (line {made.line})" if made is not None else ""
    fix = (f"If `{name}` is meant as a separate value, make it a copy: `{copy}`{where}." if copy else
           f"If `{name}` is meant as a separate value, make it a copy with `.clone()` where it is created.")
    if f.facts.eager_check == "no_grad_view_base":  # the base was written; the view is only read here
        why = (f"`{name}` is a view created under torch.no_grad(){where} of a tensor that requires grad; that tensor "
               f"was written in place since, with grad mode on, and `{code}` uses `{name}`: autograd cannot tell "
               f"whether the view should see the tracked write, so it refuses.")
        fix += (f" If `{name}` should follow the write without being tracked, make it with `.detach()` instead; if "
                f"it should be tracked, create the view outside no_grad.")
    else:
        why = (f"`{name}` is a view created under torch.no_grad(){where} of a tensor that requires grad, and `{code}` "
               f"writes it with grad mode on: autograd cannot tell whether the write should be tracked, so it "
               f"refuses.")
        fix += (f" If the write should change the original without being tracked, move `{code}` into the same "
                f"`with torch.no_grad():` block; if it should be tracked, create the view outside no_grad.")
    return Verdict(
        "no_grad_view_inplace", why, fix,
        [FixIntent("clone_assignment", made.file, made.line, target=name,
                   reason=f"`{name}` becomes a copy, which the write may change")] if copy and made is not None else [],
        _created_at(f),
    )


def function_view_rule(f: Finding, _: object) -> Verdict:
    at, written, op = _write_at(f), f.facts.written, f.facts.view_op or "?"
    if op.endswith("Backward"):  # torch 2.4 names the Function's node ("BackwardHookFunctionBackward")
        op = op[: -len("Backward")]
    code = at.code if at else ""
    rewritten = out_of_place(code) if code else None
    wrote = _module_wrote(f)
    fix = ((f"Write it out of place (`{rewritten}`), " if rewritten else "Write it out of place, ")
           + f"or clone the output (`y = y.clone()`), or make {op}.forward return a fresh tensor (not a view of an "
           f"input).")
    if wrote and op == "BackwardHookFunction":  # torch's own Function: the module that wrote is the one to change
        fix = (f"Construct {wrote} with inplace=False, so that it returns a new tensor. A module's full backward "
               f"hook (register_full_backward_hook) hands on its output through BackwardHookFunction, whose output "
               f"cannot be written in place.")
    elif wrote:
        fix = f"Construct {wrote} with inplace=False, or " + fix[0].lower() + fix[1:]
    return Verdict(
        "custom_function_view_inplace",
        f"`{written or 'the tensor'}` is a view returned by the custom autograd Function {op}; autograd cannot rebase "
        f"the Function's backward on an in-place write into its output."
        if not wrote else f"{wrote} wrote in place into the output of the autograd Function {op}; autograd cannot "
        f"rebase the Function's backward on an in-place write into its output.",
        fix,
        _preferred_first(_rewrite_intents(at, written, f"a new tensor instead of a write into the view {op} returned")
                         + _clone_before_intent(at, written, preferred=False)),
        [("view from", op), *_created_at(f)],
    )


# -- a backward through a graph an earlier backward freed ----------------------------------------------------------

class _Twice:
    """What every backward-twice row reads: the failing backward, the earlier one that freed the graph, and how
    to name a line (``line N`` in the failing backward's file, ``file:N`` elsewhere)."""

    def __init__(self, f: Finding):
        self.location = SourceLocation.from_dict(f.facts.backward_at)
        self.code = self.location.code if self.location is not None else ""
        self.earlier = _write_at(f)  # the earlier backward, the "write" of this kind
        self.home = self.location.file if self.location is not None else None

    def at(self, loc: SourceLocation) -> str:
        return f"line {loc.line}" if self.home is not None and loc.file == self.home else loc.short

    def freed_by(self) -> list[tuple[str, str]]:
        earlier = self.earlier
        return [("freed by", f"the earlier backward at {self.at(earlier)}: {earlier.code}")] if earlier else []


def carried_rule(f: Finding, _: object) -> Verdict:
    case, state = _Twice(f), f.facts.carried
    assert state is not None and case.location is not None  # the row's when; the probe read the loop at that line
    is_tuple = f.facts.carried_tensors is not None
    kind_of = f"a tuple of {f.facts.carried_tensors} tensors" if is_tuple else "a tensor"
    earlier = case.earlier
    return Verdict(
        "carried_state_backward_twice",
        f"`{state.name}` carries the previous iteration's output into this one without .detach(), so this "
        f"backward at {case.at(case.location)} runs on into the previous iteration's graph. The previous backward "
        f"{'at ' + case.at(earlier) + ' ' if earlier else ''}already freed that graph's saved tensors (backward "
        f"frees them unless retain_graph=True).",
        f"Detach the carried state: {state.detach_fix(is_tuple)}. Each backward then covers only its own "
        f"iteration (truncated backpropagation through time). Do not add retain_graph=True to silence this: "
        f"it keeps every iteration's graph alive, and the next optimizer step turns it into \"modified by "
        f"an inplace operation\".",
        [state.detach_intent(is_tuple)],
        [("carried by", f"`{state.name}` ({kind_of}), assigned at {case.at(state.assignment)}: "
                        f"{state.assignment.code}"), *case.freed_by()],
    )


def _is_expression_statement(code: str) -> bool:
    """``optimizer.backward(loss)``: a call whose value nothing reads (deleting it breaks no later name)."""
    tree = parse_code(code)
    body = tree.body if tree is not None else []
    return len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Call)


def same_loss_rule(f: Finding, _: object) -> Verdict:
    case, receiver = _Twice(f), f.facts.receiver
    assert f.facts.same_loss is not None and case.location is not None  # the row's when; read at the backward
    first, path, again = f.facts.same_loss
    at, location = case.at, case.location
    called = f" (called from {at(path)})" if (path.file, path.line) != (first.file, first.line) else ""
    through = f" (through `{case.code}` at {at(location)})" if (again.file, again.line) != (
        location.file, location.line) else ""
    code = statement_code(again)
    return Verdict(
        "same_loss_backward_twice",
        f"The same `{receiver}` is backpropagated twice{through}: `{first.code}` at {at(first)}{called} "
        f"already ran its backward, which freed the saved tensors of its graph, and `{again.code}` at "
        f"{at(again)} backpropagates it again.",
        f"Backpropagate each loss once: delete `{again.code}` at {at(again)}; the call at {at(first)} already "
        f"computed its gradients. retain_graph=True would only hide it: the second backward would add the "
        f"same gradients again.",
        [FixIntent("remove_statement", again.file, again.line, target=code,
                   reason=f"`{receiver}` is already backpropagated at {at(first)}")]
        if _is_expression_statement(code) else [],
        [("freed by", f"the backward of the same `{receiver}` at {at(first)}{called}: {first.code}"),
         ("again", f"at {at(again)}: {again.code}")],
    )


def hoisted_rule(f: Finding, _: object) -> Verdict:
    case, hoisted = _Twice(f), f.facts.forward_before_loop
    assert hoisted is not None and case.location is not None  # the row's when; read at the backward
    location = case.location
    name, lines = hoisted["name"], (f"line {hoisted['first']}" if hoisted["first"] == hoisted["last"]
                                    else f"lines {hoisted['first']}-{hoisted['last']}")
    return Verdict(
        "forward_outside_loop",
        f"`{name}` is made once, before the loop ({lines}), and backpropagated in every iteration at "
        f"{case.at(location)}: the first backward frees the saved tensors of its graph, and the next iteration "
        f"backpropagates the same graph again.",
        f"Run the forward inside the loop: {lines} again before line {hoisted['line']}, so every iteration "
        f"backpropagates a graph of its own (and sees the updated weights). retain_graph=True would only "
        f"hide it: every iteration would reuse the first forward's values.",
        [FixIntent("insert_before", location.file, hoisted["line"], target=name, detail={"code": hoisted["code"]},
                   reason=f"the forward ({lines}) runs in every iteration, so each backward has its own graph")],
        [("made", f"`{name}` once, before the loop ({lines})"), *case.freed_by()],
    )


def crossing_rule(f: Finding, _: object) -> Verdict:
    case, crossing = _Twice(f), f.facts.crossing
    assert crossing is not None and case.location is not None  # the row's when; read at the backward
    at, earlier, location, made = case.at, case.earlier, case.location, crossing.made
    fixes: list[FixIntent] = []
    freed_by = f"the backward at {at(earlier)} (`{earlier.code}`)" if earlier is not None else "an earlier backward"
    fed = (f" `{crossing.used.code}` ({at(crossing.used)}) fed `{crossing.name}` into that backward's graph "
           f"without .detach(), so" if crossing.used is not None else "")
    why = (f"`{crossing.name}`{' (made at ' + at(made) + ')' if made else ''} belongs to a graph that "
           f"{freed_by} already went through and freed:{fed} that backward ran on into the graph that made "
           f"`{crossing.name}`. The backward at {at(location)} (`{case.code}`) reaches that graph again "
           f"through `{crossing.name}` and finds its saved tensors gone.")
    if crossing.holder == "module attribute":
        why, fix = _module_state_fix(case, crossing, freed_by, fixes)
    elif crossing.used is not None and crossing.callee:
        fix = (f"Detach it where the earlier loss uses it: `{crossing.callee}({crossing.name}.detach())` at "
               f"{at(crossing.used)}, so the earlier backward stops at `{crossing.name}` and leaves its graph "
               f"for the backward at {at(location)}. If the earlier loss must train what made `{crossing.name}` "
               f"through it, detach it where the later loss reads it instead "
               f"(`gradguard fix` tries both and keeps the one that leaves every optimizer its gradients).")
        fixes.append(FixIntent("detach_argument", crossing.used.file, crossing.used.line, target=crossing.name,
                               detail={"call": crossing.callee},
                               reason=f"the backward at {at(earlier) if earlier else 'the earlier line'} then "
                                      f"stops at `{crossing.name}`"))
    else:
        fix = (f"Detach `{crossing.name}` where an earlier loss uses it (`{crossing.name}.detach()`), or "
               f"recompute it after the earlier backward, so each backward covers its own graph.")
        fix += _detach_where_kept(case, crossing, fixes) + _emptied_after_use(case, crossing, fixes)
        if made is not None and not _makes_empty(made):
            kept = len(fixes)
            fix += _detach_where_made(case, crossing, made, fixes)
            fixes[kept:] = [dataclasses.replace(x, preferred=not kept) for x in fixes[kept:]]  # an alternative
            fix += _made_once(case, crossing, fixes)
    crosses = [("crosses", f"`{crossing.name}`, made at {at(made)}: {made.code}")] if made is not None else []
    return Verdict("freed_graph_reused", why, fix, fixes, [*crosses, *case.freed_by()])


def _module_state_fix(case: _Twice, crossing: CrossingTensor, freed_by: str,
                      fixes: list[FixIntent]) -> tuple[str, str]:
    """(why, fix) for state a module keeps between forwards that still holds a freed graph."""
    assert case.location is not None  # the row's when
    at, made = case.at, crossing.made
    # NOTE [Finding the crossing by the graph] (backends/torch/graph.py): state a module keeps between forwards
    # (a membrane, a hidden state) still holds the previous iteration's graph when the next forward starts from it.
    held = (f"`{crossing.binding}` of {crossing.name}" if crossing.binding
            else crossing.name)  # `net.1.mem` is no Python expression: the path stays plain text
    why = (f"{held} is state the module keeps from one forward to the next"
           f"{' (assigned at ' + at(made) + ')' if made else ''}. It still holds the graph of the previous "
           f"iteration, which {freed_by} already went through and freed; this iteration's forward starts "
           f"from it, so the backward at {at(case.location)} (`{case.code}`) runs on into that freed graph.")
    binding = crossing.binding or ""
    reason = (f"`{binding}` carries values into the next batch, not its graph" if binding
              else f"{held} carries values into the next iteration, not its graph")
    how, intent = _state_detach(at, crossing, binding, reason)
    fix = ("Reset the state before each new sequence (set it to a fresh tensor, as a `reset()` or "
           "`reset_net(model)` after the optimizer step does)" + how
           + ". retain_graph=True would only hide it: every iteration would backpropagate into all earlier "
             "ones.")
    fixes += [intent] if intent is not None else []
    return why, fix + _made_once(case, crossing, fixes)


def _made_once(case: _Twice, crossing: CrossingTensor, fixes: list[FixIntent]) -> str:
    """The sentence (and alternative intent) for state made only while a test of it holds (``if self.cache is
    None:``, a cache filled on the first call): made every time instead, each step has a graph of its own."""
    made, held = crossing.made, crossing.binding or crossing.name
    # the name, or the attribute as its class spells it (`head._cache` is `self._cache` in the method)
    spelt = {held, crossing.name, "self." + crossing.name.rsplit(".", 1)[-1]}
    tree = parse_file(made.file) if made is not None else None
    if made is None or tree is None:
        return ""
    guards = [node for node in ast.walk(tree) if isinstance(node, ast.If) and not node.orelse
              and node.lineno < made.line <= (node.end_lineno or node.lineno)
              and any(ast.unparse(n) in spelt for n in ast.walk(node.test))]
    if not guards:
        return ""
    guard = max(guards, key=lambda node: node.lineno)
    held = next(ast.unparse(n) for n in ast.walk(guard.test) if ast.unparse(n) in spelt)
    test = ast.unparse(guard.test)
    fixes.append(FixIntent("run_unconditionally", made.file, guard.lineno, target=held, detail={"test": test},
                           preferred=not fixes,
                           reason=f"`{held}` is made in every call, so each step backpropagates a graph of its own"))
    return (f" It is made only while `{test}` ({case.at(made)} under line {guard.lineno}), then kept: if it "
            f"depends on what the optimizer trains, make it in every call instead (drop the `if`).")


def _state_detach(at: Callable[[SourceLocation], str], crossing: CrossingTensor, binding: str,
                  reason: str) -> tuple[str, FixIntent | None]:
    """(the clause of the fix, its intent) that detaches module state: right after the statement that makes it
    (a tuple target), on that statement's value, or, when no statement of the class assigns it (a
    ``register_buffer`` cache), where the module reads it back; ("", None) when none applies."""
    made = crossing.made
    if made is None:
        read = crossing.read if binding else None
        if read is None:
            return "", None
        return (f", or detach it where the module reads it back: `{binding}.detach()` in `{read.code}` ({at(read)})",
                FixIntent("detach_expression", read.file, read.line, target=binding, reason=reason))
    names = assigned_names(statement_code(made))
    if len(names) > 1 and binding in names:  # `out, self.h = ...`
        # a tuple target cannot take `.detach()` on its right-hand side: detach the state on the next line
        detach_code = f"{binding} = {binding}.detach()"
        return (f", or detach it right after it is made: insert `{detach_code}` after {at(made)}",
                FixIntent("insert_after", made.file, made.line, target=binding, detail={"code": detach_code},
                          reason=reason))
    detached = _clone_assignment(statement_code(made), "detach")
    if detached is None:
        return "", None
    return (f", or detach it where it is made: `{detached}` ({at(made)})",
            FixIntent("detach_assignment", made.file, made.line, target=binding, reason=reason))


def _detach_where_kept(case: _Twice, crossing: CrossingTensor, fixes: list[FixIntent]) -> str:
    """The sentence (and intents, applied together) that detach an element of a container where each item enters it
    (``bank.append(z)``): a container kept across steps (a memory bank, a window of targets, a history) then keeps
    values, not the graphs they were made in."""
    if crossing.holder != "element" or "[" not in crossing.name or case.location is None:
        return ""
    container = crossing.name.split("[", 1)[0]
    file = (crossing.made or case.location).file
    entries = container_entries(file, container)
    if not entries:
        return ""
    reason = f"`{container}` then keeps values across steps, not the graphs they were made in"
    fixes += [FixIntent("detach_argument", file, line, target=item, detail={"call": callee}, reason=reason)
              for line, item, callee in entries]
    line, item, callee = entries[0]
    return (f" If `{container}` keeps values across steps (a memory bank, a window of targets, a history), detach "
            f"each where it enters: `{callee}({item}.detach())` (line {line}"
            f"{' and the other ' + str(len(entries) - 1) if len(entries) > 1 else ''}).")


# NOTE [Buffers filled in step]
# A list (or deque) that collects one episode's items for one loss (REINFORCE's log-probabilities, with the rewards
# filled beside it) must be emptied once that loss has been backpropagated; kept, the next episode's loss runs
# through the earlier episodes' items into graphs that backward freed. Detaching the items where they enter would
# cut the only path to the weights (verification refuses it), so the buffer, and every buffer the probe saw
# holding as many items beside it (filled in step: emptied together, or `zip` would pair the next episode's items
# with this one's), is emptied after the block of the earlier backward. Only buffers the file fills by
# `append`/`appendleft`/`insert` are: a history kept for logging has as many items only by chance, and is filled
# by the same calls, so the verification run decides (a memory bank emptied every step would still run clean: the
# detach where its items enter is tried first).
def _emptied_after_use(case: _Twice, crossing: CrossingTensor, fixes: list[FixIntent]) -> str:
    """The sentence (and intents, applied together) that empty the buffers of NOTE [Buffers filled in step]."""
    earlier, filled = case.earlier, crossing.kept_with
    if not filled or earlier is None:
        return ""
    where = _end_of_block(earlier.file, earlier.line)
    if where is None:
        return ""
    action, line = where
    code = "\n".join(f"{name}.clear()" for name in filled)
    fixes.append(FixIntent(action, earlier.file, line, target=filled[0], detail={"code": code},
                           preferred=not fixes,
                           reason="each backward then covers only the items collected since the previous one"))
    beside = f" (and {', '.join(f'`{n}`' for n in filled[1:])}, filled in step with it)" if filled[1:] else ""
    return (f" If `{filled[0]}` collects one episode's items for one loss, empty it once that loss is "
            f"backpropagated: `{filled[0]}.clear()`{beside} {action.replace('_', ' ')} line {line}.")


def _end_of_block(file: str, line: int) -> tuple[str, int] | None:
    """Where a statement goes to run last in the block holding the statement at ``line``: ("insert_after", its last
    simple statement), ("insert_before", a final return/break/continue/raise), or after ``line`` itself when the
    block ends in a compound statement; None when the file does not parse."""
    tree = parse_file(file)
    bodies = list(bodies_with_line(tree, line)) if tree is not None else []
    if not bodies:
        return None
    last = bodies[-1][-1]  # breadth first: the innermost block last
    if isinstance(last, (ast.Return, ast.Break, ast.Continue, ast.Raise)):
        return "insert_before", last.lineno
    if isinstance(last, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete, ast.Pass)):
        return "insert_after", last.lineno
    return "insert_after", line


def _makes_empty(made: SourceLocation) -> bool:
    """``self.saved = []``, ``buf = deque(maxlen=8)``: a statement that binds an empty container (there is
    nothing to detach where it is made)."""
    stmt = parse_statement(statement_code(made))
    value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
    if isinstance(value, (ast.List, ast.Tuple, ast.Dict, ast.Set)):
        return not (value.keys if isinstance(value, ast.Dict) else value.elts)
    return isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in (
        "list", "deque", "dict") and not value.args


def _detach_where_made(case: _Twice, crossing: CrossingTensor, made: SourceLocation, fixes: list[FixIntent]) -> str:
    """The sentence (and intent) that detaches the crossing tensor at the statement that made it."""
    names = assigned_names(statement_code(made))
    stmt = parse_statement(statement_code(made))
    if isinstance(stmt, ast.Assign) and crossing.binding not in names and crossing.binding in [
            ast.unparse(t) for t in stmt.targets]:
        names = [*names, crossing.binding]  # an item by a computed key: `state[sid] = hidden`
    # the name, the attribute as its class writes it, or (for an element, `self.hidden[0]`) what holds it
    wanted = {crossing.name, "self." + crossing.name.rsplit(".", 1)[-1], crossing.binding or crossing.name}
    target = next((t for t in names if t in wanted), None)
    detached = _clone_assignment(statement_code(made), "detach")
    several = len(names) > 1  # `out, self.hidden = self.lstm(...)`
    if target is not None and (several or crossing.holds_sequence):
        detach_code = (f"{target} = tuple(h.detach() for h in {target})"
                       if crossing.holds_sequence else f"{target} = {target}.detach()")
        fixes.append(FixIntent("insert_after", made.file, made.line, target=target, detail={"code": detach_code},
                               reason=f"`{target}` carries values into the next batch, not its graph"))
        return (f" If it is state carried from one batch to the next (a recurrent hidden state), detach "
                f"it right after it is made: insert `{detach_code}` after {case.at(made)}.")
    if target is not None and detached is not None:
        fixes.append(FixIntent("detach_assignment", made.file, made.line, target=target,
                               reason=f"`{target}` is a value for later losses, not a path for their gradients"))
        return (f" If later losses only need its value (a constant such as a target, a centre or old "
                f"log-probabilities), detach it where it is made: `{detached}` ({case.at(made)}).")
    return ""


def accumulated_rule(f: Finding, _: object) -> Verdict:
    case, receiver, lines = _Twice(f), f.facts.receiver, f.facts.accumulation
    assert lines is not None and case.location is not None and case.earlier is not None  # the row's when
    at, location = case.at, case.location
    saver = SourceLocation(location.file, lines["first"], location.function)  # code read on first use
    return Verdict(
        "accumulated_loss_not_reset",
        f"`{receiver}` accumulates losses ({at(saver)}) and is backpropagated at {at(case.earlier)}, which frees "
        f"that graph's saved tensors; it is not reset afterwards, so line {lines['again']} adds the next "
        f"losses to the same `{receiver}`, and the backward at {at(location)} runs through the freed graph "
        f"again.",
        f"Reset the accumulator before accumulating again: insert `{receiver} = 0` before line "
        f"{lines['reset_before']}, so each backward covers only its own losses.",
        [FixIntent("insert_before", location.file, lines["reset_before"], target=receiver,
                   detail={"code": f"{receiver} = 0"},
                   reason=f"the backward at {at(location)} then covers only the losses added after it")],
        [("accumulates", f"`{receiver}` at {at(saver)}, and again at line {lines['again']} without a reset in "
                         f"between"), *case.freed_by()],
    )


def running_sum_rule(f: Finding, _: object) -> Verdict:
    """A loop that adds each step's loss into a running sum and backpropagates the sum in every step."""
    case, receiver, lines = _Twice(f), f.facts.receiver, f.facts.accumulation
    assert lines is not None and case.location is not None and receiver is not None  # the row's when
    at, location, term = case.at, case.location, lines["term"]
    added = SourceLocation(location.file, lines["first"], location.function)  # code read on first use
    fixes = [FixIntent("replace_expression", location.file, location.line, target=receiver, detail={"with": term},
                       reason=f"each step backpropagates its own `{term}` once"),
             FixIntent("detach_expression", added.file, added.line, target=term,
                       reason=f"`{receiver}` keeps the sum's value, not every step's graph")]
    from .edits import EditNotApplicable, apply_intents  # libcst loads on first use, not with the guard

    try:
        backward, summed = (apply_intents(statement_code(x) + "\n", [dataclasses.replace(i, line=1)]).strip()
                            for x, i in ((location, fixes[0]), (added, fixes[1])))
    except EditNotApplicable:
        backward, summed = f"backward of `{term}`", f"`{term}.detach()` added"
    return Verdict(
        "accumulated_loss_backpropagated",
        f"`{receiver}` adds up the loss of every step ({at(added)}: `{added.code}`), and {at(location)} "
        f"backpropagates `{receiver}` in every step: the earlier steps' terms were backpropagated already, which "
        f"freed their graphs, so this backward runs into a freed graph (and would count them twice).",
        f"Backpropagate each step's own loss and keep only the value in the sum: `{backward}` ({at(location)}) "
        f"and `{summed}` ({at(added)}). The gradients are those of each step's loss backpropagated once, as "
        f"gradient accumulation means.",
        fixes,
        [("accumulates", f"`{receiver}` at {at(added)}, backpropagated in every step"), *case.freed_by()],
    )


# -- a backward of a tensor autograd never recorded (NOTE [Where the graph stopped], backends/torch/no_graph.py) ----

def no_graph_rule(f: Finding, _: object) -> Verdict:
    receiver, cut = f.facts.receiver or "the tensor", f.facts.graph_cut or {}
    at = SourceLocation(cut["file"], cut["line"], "", cut["code"]) if cut else None
    failing = SourceLocation.from_dict(f.facts.backward_at)

    def where(location: SourceLocation) -> str:  # "line 7" in the failing call's file
        return f"line {location.line}" if failing is not None and failing.file == location.file else location.short
    if cut.get("cause") == "constant_gradient" and at is not None:
        return Verdict(
            "second_order_without_create_graph",
            f"`{receiver}` has no graph: it comes from `{cut['call']}` at {where(at)}, called without "
            f"create_graph=True, which returns the gradient as a constant. Differentiating it again (a second "
            f"derivative, a gradient penalty) needs the graph of that gradient, so PyTorch finds nothing to "
            f"backpropagate.",
            f"Pass create_graph=True to that call ({where(at)}: `{at.code}`): the gradient is then recorded, and can "
            f"be differentiated again.",
            [FixIntent("set_keyword", at.file, at.line, target=receiver,
                       detail={"call": cut["call"], "keyword": "create_graph", "value": True, "add": True},
                       reason=f"the gradient at {where(at)} is recorded, so it can be differentiated again")],
            [("gradient", f"made without create_graph at {where(at)}: {at.code}")])
    if cut.get("cause") == "reentrant_checkpoint" and at is not None:
        return Verdict(
            "reentrant_checkpoint_without_grad_input",
            f"`{receiver}` has no graph. The checkpoint at {where(at)} is reentrant (use_reentrant=True, torch's "
            f"default): its output requires grad only when one of its tensor inputs does, whatever the parameters "
            f"inside it; when none does (the output of a frozen embedding), nothing after it is recorded.",
            f"Pass use_reentrant=False to the checkpoint ({where(at)}): the non-reentrant checkpoint records the graph "
            f"through the checkpointed function's parameters. Or make its input require grad (Hugging Face: "
            f"`model.enable_input_require_grads()`).",
            [FixIntent("set_keyword", at.file, at.line, target=receiver,
                       detail={"call": cut["call"], "keyword": "use_reentrant", "value": False, "add": True},
                       reason="the checkpointed function's parameters are recorded whatever its input")],
            [("checkpoint", f"reentrant at {where(at)}: {at.code}")])
    return Verdict(
        "no_graph",
        f"`{receiver}` does not require grad: nothing on its path was recorded by autograd. It was computed under "
        f"torch.no_grad() or inference_mode, from detached tensors or numbers (.item(), numpy), or only from "
        f"tensors that do not require grad (frozen parameters).",
        "Compute it with grad mode on from tensors that require grad: look for a no_grad block, a .detach() or "
        ".item() on its path, or parameters with requires_grad=False.",
        display=[("made", f"at {where(f.facts.made_at)}: {f.facts.made_at.code}")] if f.facts.made_at else [])


# -- a gradient read from a tensor that is no leaf (NOTE [A gradient read from a tensor that is no leaf],
# backends/torch/grad_read.py) ---------------------------------------------------------------------------------

class _Grad:
    """What every row about a tensor backward fills no .grad for reads: its name where the fix goes, the name the
    failing line reads it by, where it was made, where the error surfaced, and how to name a line."""

    def __init__(self, f: Finding):
        self.name = f.facts.receiver or "the tensor"
        self.made, self.at = f.facts.made_at, SourceLocation.from_dict(f.facts.backward_at)
        self.read_as = (f.tensor.name if f.tensor is not None else None) or self.name  # the caller's `image`: `x`
        self.produced = f" (output of {f.tensor.producer})" if f.tensor is not None and f.tensor.producer else ""
        self.display = [("made", f"at {self.where(self.made)}: {self.made.code}")] if self.made is not None else []

    def where(self, location: SourceLocation) -> str:
        return f"line {location.line}" if self.at is not None and self.at.file == location.file else location.short

    def made_text(self) -> str:
        return f", made at {self.where(self.made)} (`{self.made.code}`)" if self.made is not None else ""

    def inserted(self, code: str, reason: str) -> list[FixIntent]:
        made = self.made
        return [FixIntent("insert_after", made.file, made.line, target=self.name, detail={"code": code},
                          reason=reason)] if made is not None else []


def non_leaf_grad_rule(f: Finding, _: object) -> Verdict:
    g = _Grad(f)
    name, made = g.name, g.made
    at_read = f" at {g.where(g.at)}" if g.at is not None else ""
    at_read = f" (read as `{g.read_as}.grad`{at_read})" if g.read_as != name else at_read
    fixes = g.inserted(f"{name}.retain_grad()", f"backward then keeps the gradient of `{name}`")
    keep = f"insert `{name}.retain_grad()` after {g.where(made)}" if made is not None else (
        f"call `{name}.retain_grad()` where it is made")
    made_leaf, intent = _leaf_where_made(name, made, preferred=False)
    leaf = ""
    if intent is not None:  # second: a history a later loss still needs (a saliency map's input) stays as it was
        fixes.append(intent)
        leaf = (f" If it should be an input of its own from there on (an adversarial example between attack "
                f"steps: kept, each step's backward would run through all earlier ones), make it a leaf where it "
                f"is made: `{name} = {made_leaf}`.")
    return Verdict(
        "grad_of_non_leaf",
        f"`{name}` is a tensor autograd computed{g.produced}{g.made_text()}, not a leaf: backward accumulates "
        f"gradients only into leaves (and tensors that called .retain_grad()), so `{name}.grad`{at_read} is None "
        f"and the line fails on it ({f.facts.torch_message}). PyTorch only warns at the read.",
        f"Keep its gradient: {keep}.{leaf}", fixes, g.display)


def grad_not_required_rule(f: Finding, _: object) -> Verdict:
    g = _Grad(f)
    name, made = g.name, g.made
    made_text = f" (made at {g.where(made)}: `{made.code}`)" if made is not None else ""
    called = f", read as `{g.read_as}`," if g.read_as != name else ""
    return Verdict(
        "grad_of_tensor_not_requiring_grad",
        f"`{name}`{made_text}{called} does not require grad: backward computes gradients only for tensors that do, "
        f"so `{g.read_as}.grad`{' at ' + g.where(g.at) if g.at is not None else ''} is None and the line fails on "
        f"it ({f.facts.torch_message}).",
        (f"Ask for its gradient before the forward reads it: insert `{name}.requires_grad_()` after "
         f"{g.where(made)}." if made is not None else f"Call `{name}.requires_grad_()` before the forward reads it."),
        g.inserted(f"{name}.requires_grad_()", f"backward then computes the gradient of `{name}`"), g.display)


def _leaf_where_made(name: str, made: SourceLocation | None, preferred: bool) -> tuple[str, FixIntent | None]:
    """(the leaf's expression, the intent) that make ``name`` a leaf where ``made`` assigns it alone."""
    stmt = parse_statement(statement_code(made)) if made is not None else None
    if made is None or not isinstance(stmt, ast.Assign) or [ast.unparse(t) for t in stmt.targets] != [name]:
        return "", None
    value = ast.unparse(stmt.value)
    leaf = f"({value}).detach().requires_grad_()"
    return leaf, FixIntent("replace_expression", made.file, made.line, target=value, detail={"with": leaf},
                           preferred=preferred, reason=f"`{name}` is a leaf of its own from there on")


def non_leaf_param_rule(f: Finding, _: object) -> Verdict:
    g = _Grad(f)
    name = g.name
    leaf, intent = _leaf_where_made(name, g.made, preferred=True)
    fix = (f"Make it a leaf where it is made: `{name} = {leaf}`" if intent is not None else
           f"Make `{name}` a leaf: compute its value first, then call `.requires_grad_()` on it")
    return Verdict(
        "optimizer_of_non_leaf",
        f"`{name}` is a tensor autograd computed{g.produced}{g.made_text()}, not a leaf: an optimizer updates leaves, "
        f"the tensors backward accumulates .grad into, so the optimizer"
        f"{' at ' + g.where(g.at) if g.at is not None else ''} refuses it ({f.facts.torch_message}). "
        f"`requires_grad=True` on a tensor that is then scaled or shifted makes the leaf before the arithmetic, and "
        f"the parameter after it.",
        f"{fix}, so the value is computed first and the parameter is that value.",
        [intent] if intent is not None else [], g.display)


def unknown_twice_rule(f: Finding, _: object) -> Verdict:
    return Verdict(
        "backward_twice",
        "An earlier backward freed the saved tensors of part of this graph (backward frees them unless "
        "retain_graph=True). This backward reaches that part again: usually a tensor from a previous "
        "iteration (an RNN hidden state, a running average, a cached embedding) was carried into this "
        "iteration without .detach(), or the same loss is backpropagated twice.",
        "Detach what you carry across iterations (`h = h.detach()`), so each backward only covers its own "
        "iteration. Pass retain_graph=True to the earlier backward only if you really need to backpropagate "
        "through the same graph twice (and then do not step the optimizer in between).",
        display=_Twice(f).freed_by(),
    )
