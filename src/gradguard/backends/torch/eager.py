"""Errors PyTorch raises eagerly (at the write, or at a second backward): add what it does not say.

PyTorch checks these in its autograd kernels before any Python hook or mode sees the op, so the guard
recognises them by message when they leave the guarded block, and reads the user's frame to name the tensor.
"""

from __future__ import annotations

import ast
import re

import torch

from ..._errors import BackwardTwiceError, GradientHazardError, InplaceModificationError
from ...core.diagnosis import diagnose
from ...core.facts import Facts
from ...core.findings import Finding, SaveSite, SourceLocation, TensorInfo, WriteRecord
from ...core.intents import FixIntent
from ...core.frames import innermost_user_entry
from ...core.fixes import assigned_names, carried_state, out_of_place, statement_code
from ...core.source_ast import (parse_file, statement_at, accumulations, assignment_before, resets_between,
                                 written_expression)
from .backward_calls import _is_user, raised_chain, second_call_of_same_loss
from .graph import _reaches_any, walk_nodes
from .loss_site import forward_before_loop
from .naming import name_tensor
from .receiver import _backward_receiver, _lookup
from ...core.internal import log_fallback

__all__ = ["enrich_eager_error"]

_LEAF = "a leaf Variable that requires grad is being used in an in-place operation"
_VIEW_OF_LEAF = "a view of a leaf Variable that requires grad is being used in an in-place operation"
_MULTI_VIEW = re.compile(r"Output \d+ of (\w+) is a view and is being modified inplace\. This view is the output "
                         r"of a function that returns multiple views")
_NO_GRAD_VIEW = "A view was created in no_grad mode and is being modified inplace with grad mode enabled"
_FUNCTION_VIEW = re.compile(r"Output \d+ of (\w+) is a view and is being modified inplace\. This view was created "
                            r"inside a custom Function")
_BACKWARD_TWICE = "Trying to backward through the graph a second time"


def _describe(tensor, expression: str | None) -> TensorInfo:
    if not isinstance(tensor, torch.Tensor):
        return TensorInfo(shape=(), dtype="?", name=expression, role="tensor")
    name, role = name_tensor(tensor)
    if role is None:
        role = "leaf" if tensor.is_leaf else ("view" if tensor._is_view() else "activation")
        name = expression
    elif expression and "." in expression and name and name.split(".", 1)[0] != expression.split(".", 1)[0]:
        # The heap scan names modules by the variable in the user's frames, which are gone once the error
        # has left them (it falls back to the class name, "Embedding.weight"); the expression the user wrote
        # ("embedding.weight") is what they will recognise.
        name = expression
    grad_fn = tensor.grad_fn
    return TensorInfo(
        shape=tuple(tensor.shape), dtype=str(tensor.dtype).replace("torch.", ""), device=str(tensor.device),
        name=name, role=role, producer=grad_fn.name() if grad_fn is not None else None,
    )


def enrich_eager_error(error: BaseException, session=None) -> GradientHazardError | None:
    """A gradguard error carrying a finding for one of PyTorch's eager in-place/backward errors, or None."""
    if not isinstance(error, RuntimeError) or isinstance(error, GradientHazardError):
        return None
    message = str(error)
    try:
        if _BACKWARD_TWICE in message:
            return BackwardTwiceError(_backward_twice(error, session))
        for matcher, builder in (
            (lambda m: _VIEW_OF_LEAF in m, _view_of_leaf),
            (lambda m: _LEAF in m, _leaf),
            (_MULTI_VIEW.search, _multi_view),
            (lambda m: _NO_GRAD_VIEW in m, _no_grad_view),
            (_FUNCTION_VIEW.search, _function_view),
        ):
            match = matcher(message)
            if match:
                return InplaceModificationError(builder(_Site(error), match))
    except Exception as error:  # an enrichment failure must never replace the user's error
        log_fallback("backends.torch", "explaining an eager error", error)
        return None
    return None


class _Site:
    """Where the eager error surfaced in user code: the line, the written expression, its value."""

    def __init__(self, error: BaseException):
        import linecache

        self.error = error
        self.location = self.expression = self.tensor = self.frame = None
        self.code = ""
        entry = innermost_user_entry(error.__traceback__)
        if entry is None:
            return
        frame = entry.tb_frame
        filename, line = frame.f_code.co_filename, entry.tb_lineno
        self.frame = frame
        self.code = linecache.getline(filename, line).strip()
        self.location = SourceLocation(filename, line, frame.f_code.co_name, self.code)
        self.expression = written_expression(filename, line) or _view_named_by_error(error, filename, line, frame)
        self.tensor = _lookup(self.expression, frame) if self.expression else None
        self.info = _describe(self.tensor, self.expression)
        self.made = None
        if self.expression and self.info.role not in ("parameter", "buffer"):
            made = assignment_before(filename, line, self.expression)
            # assignment_before also matches `w.grad = ...` for `w` (it collects every name inside a target);
            # only a statement that binds the expression itself says where the tensor was made.
            if made is not None and self.expression in assigned_names(statement_code(made)):
                self.made = made

    @property
    def name(self) -> str:
        return self.expression or "the tensor"


def _view_named_by_error(error: BaseException, filename: str, line: int, frame) -> str | None:
    """The variable on the line whose tensor is the view PyTorch's message names ("Output 1 of
    SplitWithSizesBackward0 is a view ..."), when the write itself happens inside a call (an in-place module,
    ``self.relu(x)``) and the line writes no expression of its own; None unless exactly one matches."""
    match = _MULTI_VIEW.search(str(error))
    stmt = statement_at(filename, line) if match else None
    if stmt is None:
        return None
    found = []
    for name in dict.fromkeys(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)):
        value = frame.f_locals.get(name, frame.f_globals.get(name))
        grad_fn = value.grad_fn if isinstance(value, torch.Tensor) else None
        if grad_fn is not None and grad_fn.name() in (match.group(1), match.group(1) + "Backward0"):
            found.append(name)
    return found[0] if len(found) == 1 else None


def _finding(kind, site: _Site, rule, why, fix, display=(), fixes=()) -> Finding:
    info = site.info if site.location is not None else _describe(None, None)
    writes = [WriteRecord(op="in-place write", location=site.location)] if site.location else []
    extra = list(display)
    if site.made is not None:
        extra.append(("created at", f"{site.made.short}: {site.made.code}"))
    elif info.role == "parameter":
        extra.append(("created at", "a module parameter (leaf tensor created by nn.Module)"))
    finding = Finding(kind=kind, tensor=info, modified_at=writes, explanation=why, suggestion=fix,
                      rule=rule, facts=Facts(display=extra, torch_message=str(site.error)), fixes=list(fixes))
    return diagnose(finding)


def _rewrite_intents(site: _Site, reason: str, preferred: bool = True) -> list[FixIntent]:
    """The write at ``site`` rewritten out of place (``x += y``, ``x.mul_(s)``, ``x[m] = v``), as an intent;
    none when the statement has no out-of-place form, or when it writes a loop variable (rebinding that
    name would drop the write the loop meant to make, e.g. ``for c in t.unbind(): c.mul_(s)``)."""
    import ast

    from ...core.fixes import mask_assignment

    if site.location is None or not site.code or _is_loop_target(site):
        return []
    try:
        stmt = ast.parse(statement_code(site.location)).body[0]
    except (SyntaxError, IndexError):
        return []
    where = (site.location.file, site.location.line)
    if isinstance(stmt, ast.AugAssign):
        return [FixIntent("augmented_to_binary", *where, target=site.expression, reason=reason, preferred=preferred)]
    if mask_assignment(statement_code(site.location)):
        return [FixIntent("inplace_to_out_of_place", *where, target=site.expression, detail={"method": "masked_fill"},
                          reason=reason, preferred=preferred)]
    if out_of_place(statement_code(site.location)):
        return [FixIntent("inplace_to_out_of_place", *where, target=site.expression, reason=reason,
                          preferred=preferred)]
    return []


def _clone_before_intent(site: _Site, preferred: bool) -> list[FixIntent]:
    """``name = name.clone()`` inserted before the write: the write then changes a copy."""
    if site.location is None or not site.expression or not site.expression.isidentifier() or _is_loop_target(site):
        return []
    name = site.expression
    return [FixIntent("insert_before", site.location.file, site.location.line, target=name,
                      detail={"code": f"{name} = {name}.clone()"},
                      reason=f"the write then changes a copy of `{name}`", preferred=preferred)]


def _binding_loops(site: _Site):
    """(tree, loops): the ``for`` loops around the write whose target binds the written name, innermost last;
    tree None when the file does not parse (then nobody can tell)."""
    import ast
    import linecache

    if site.location is None or not site.expression or not linecache.getlines(site.location.file):
        return ast.Module(body=[], type_ignores=[]), []  # no source: no loop
    tree = parse_file(site.location.file)
    if tree is None:
        return None, []
    base = site.expression.split("[", 1)[0].split(".", 1)[0]
    line = site.location.line
    loops = [node for node in ast.walk(tree) if isinstance(node, (ast.For, ast.AsyncFor))
             and node.lineno < line <= (node.end_lineno or node.lineno)
             and base in {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}]
    return tree, sorted(loops, key=lambda node: node.lineno)


def _is_loop_target(site: _Site) -> bool:
    """Whether the written name is bound by an enclosing ``for`` (a view the loop hands out piece by piece)."""
    tree, loops = _binding_loops(site)
    return tree is None or bool(loops)  # a file that does not parse: cannot tell, so do not propose a rebinding


def _index_loop_intent(site: _Site) -> list[FixIntent]:
    """The ``for`` that binds the written name, rewritten to hand out indexed views (``x = t[i]``)."""
    import ast

    tree, loops = _binding_loops(site)
    if tree is None or not loops or not isinstance(loops[-1], ast.For):  # an `async for` has no enumerate()
        return []
    name = site.expression.split("[", 1)[0].split(".", 1)[0]
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    index = next(c for c in ("i", "index", "_i", "_index") + tuple(f"_i{k}" for k in range(100)) if c not in used)
    return [FixIntent("index_loop_variable", site.location.file, loops[-1].lineno, target=name, detail={"index": index},
                      reason=f"`{name}` becomes an indexed view of the tensor (`[{index}]`), which can be written in place; "
                             f"the write still reaches the tensor", preferred=True)]


def _preferred_first(fixes: list[FixIntent]) -> list[FixIntent]:
    """When no edit is preferred, the first alternative becomes the preferred one."""
    if fixes and not any(x.preferred for x in fixes):
        first = fixes[0]
        fixes[0] = FixIntent(first.action, first.file, first.line, first.target, first.detail, first.reason, True)
    return fixes


def _no_grad_intent(site: _Site, preferred: bool = True) -> list[FixIntent]:
    if site.location is None:
        return []
    return [FixIntent("wrap_no_grad", site.location.file, site.location.line, target=site.expression,
                      reason="an update of the leaf itself: autograd must not record it", preferred=preferred)]


def _no_grad_block(code: str) -> str:
    return f"`with torch.no_grad(): {code}`"


def _leaf(site: _Site, _match) -> Finding:
    name = site.name
    is_update = ".grad" in site.code or site.info.role == "parameter"
    rewritten = out_of_place(site.code) if site.code else None
    if is_update:
        fix = (f"Make the update under no_grad, as optimizers do: {_no_grad_block(site.code)} (the update is not "
               f"part of the model, so autograd must not record it).")
    else:
        out_of_place_code = rewritten or (f"{name} = {name} + 1" if site.expression else None)
        compute = (f"write it out of place: `{out_of_place_code}`" if out_of_place_code
                   else "write the result to a new tensor instead of in place")
        fix = (f"If this computes a new value, {compute} (a new tensor; gradients still flow to the original "
               f"{name}). If it is meant to change the leaf itself (an update or initialisation), do it under "
               f"no_grad: {_no_grad_block(site.code)}.")
    return _finding(
        "leaf_inplace", site, "leaf_inplace",
        f"`{name}` is a leaf tensor that requires grad (a parameter, or created with requires_grad=True): autograd "
        f"accumulates its gradient into `{name}.grad`. Writing it in place with grad mode on would make that "
        f"gradient refer to values that no longer exist, so PyTorch refuses the write.",
        fix,
        fixes=(_no_grad_intent(site) if is_update else
               _rewrite_intents(site, f"a new tensor; gradients still flow to the original {name}")
               + _no_grad_intent(site, preferred=False)),
    )


def _view_of_leaf(site: _Site, _match) -> Finding:
    name = site.name
    copy = (f"(`{name.split('.')[-1].split('[')[0]}2 = {name}.clone()` and index that)" if site.expression
            else "(`.clone()` it and index the copy)")
    fix = (f"Initialise or update the leaf under no_grad: {_no_grad_block(site.code)}. For a computation, write "
           f"into a copy instead {copy}.")
    owner = _lookup(name.rsplit(".", 1)[0], site.frame) if site.frame is not None and "." in name else None
    if isinstance(owner, torch.nn.Embedding) and site.info.role == "parameter":
        fix += (" To keep an embedding's padding row at zero, `nn.Embedding(..., padding_idx=0)` zeroes it and "
                "keeps its gradient at zero.")
    return _finding(
        "leaf_inplace", site, "view_of_leaf_inplace",
        f"`{site.code}` writes a view (index/slice) of `{name}`, a leaf tensor that requires grad; writing the view "
        f"writes the leaf, which autograd forbids with grad mode on.",
        fix,
        fixes=_no_grad_intent(site),
    )


_MULTI_VIEW_FUNCTIONS = {"Split": "chunk()/split()", "SplitWithSizes": "split()", "Unbind": "unbind()"}


def _multi_view(site: _Site, match) -> Finding:
    op = match.group(1)
    if op.endswith("Backward0"):  # torch 2.4 names the backward node ("UnbindBackward0"), later ones the op ("Unbind")
        op = op[: -len("Backward0")]
    function = _MULTI_VIEW_FUNCTIONS.get(op, op)
    name = site.name
    rewritten = out_of_place(site.code) if site.code else None
    made = f" (line {site.made.line}: `{site.made.code}`)" if site.made is not None else ""
    loop_bound = _is_loop_target(site)
    if loop_bound:
        # Rebinding the loop variable (out of place, or to a clone) would silently drop the write the loop makes.
        fix = (f"`{name}` is the variable of a for loop over a tensor: iterating unbinds the tensor into views "
               f"that cannot be written in place one at a time, and rebinding `{name}` (out of place, or to a clone) "
               f"would leave the tensor unchanged. Index the tensor instead (`x[i]` is a view that can be written "
               f"in place: `for i in range(len(x)): x[i].mul_(s)`), or write the whole tensor at once. If no "
               f"gradient is needed through the result (an image to display), write into a detached copy "
               f"(`.detach().clone()`).")
    else:
        fix = (f"Write it out of place: `{rewritten}` instead of `{site.code}`." if rewritten
               else "Write it out of place.")
        fix += (f" Or clone the piece before writing it (`{name} = {name}.clone()`)." if site.expression else
                " Or clone the piece before writing it, and write into the clone.")
    return _finding(
        "view_inplace", site, "multi_output_view_inplace",
        f"`{name}` is one of several views returned together by {function}{made}. They share one backward node, "
        f"so autograd cannot record an in-place write into just one of them.",
        fix,
        display=[("view of", f"{op} (several views returned by {function})")],
        fixes=_preferred_first(_index_loop_intent(site) if loop_bound else
                               _rewrite_intents(site, "a new tensor instead of a write into one of several views")
                               + _clone_before_intent(site, preferred=False)),
    )


def _clone_assignment(code: str, method: str = "clone") -> str | None:
    """``first = hidden[:, :2]`` -> ``first = hidden[:, :2].clone()`` (or another method, e.g. detach)."""
    import ast

    try:
        stmt = ast.parse(code).body[0]
    except (SyntaxError, IndexError):
        return None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        value = ast.get_source_segment(code, stmt.value) or ast.unparse(stmt.value)
        if not isinstance(stmt.value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            value = f"({value})"
        return f"{ast.unparse(stmt.targets[0])} = {value}.{method}()"
    return None


def _no_grad_view(site: _Site, _match) -> Finding:
    name = site.name
    copy = _clone_assignment(site.made.code) if site.made is not None else None
    where = f" (line {site.made.line})" if site.made is not None else ""
    fix = (f"If `{name}` is meant as a separate value, make it a copy: `{copy}`{where}." if copy else
           f"If `{name}` is meant as a separate value, make it a copy with `.clone()` where it is created.")
    fix += (f" If the write should change the original without being tracked, move `{site.code}` into the same "
            f"`with torch.no_grad():` block; if it should be tracked, create the view outside no_grad.")
    return _finding(
        "view_inplace", site, "no_grad_view_inplace",
        f"`{name}` is a view created under torch.no_grad(){where} of a tensor that requires grad, and `{site.code}` "
        f"writes it with grad mode on: autograd cannot tell whether the write should be tracked, so it refuses.",
        fix,
        fixes=([FixIntent("clone_assignment", site.made.file, site.made.line, target=name,
                          reason=f"`{name}` becomes a copy, which the write may change")]
               if copy and site.made is not None else []),
    )


def _function_view(site: _Site, match) -> Finding:
    op = match.group(1)
    rewritten = out_of_place(site.code) if site.code else None
    return _finding(
        "view_inplace", site, "custom_function_view_inplace",
        f"`{site.name}` is a view returned by the custom autograd Function {op}; autograd cannot rebase the "
        f"Function's backward on an in-place write into its output.",
        (f"Write it out of place (`{rewritten}`), " if rewritten else "Write it out of place, ")
        + f"or clone the output (`y = y.clone()`), or make {op}.forward return a fresh tensor (not a view of an "
        f"input).",
        display=[("view from", op)],
        fixes=_preferred_first(_rewrite_intents(site, f"a new tensor instead of a write into the view {op} returned")
                               + _clone_before_intent(site, preferred=False)),
    )


def _carries_graph(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.grad_fn is not None
    if isinstance(value, (tuple, list)):
        return any(_carries_graph(v) for v in value)
    return False


def _freed(node) -> bool:
    """Whether an earlier backward freed this node's saved tensors (reading one raises then)."""
    for attribute in dir(node):
        if attribute.startswith("_saved_") and not attribute.startswith("_saved_tensors_hooks"):
            try:
                getattr(node, attribute)
            except RuntimeError:
                return True
    return False


def _freed_saver(site, session, current: int, latest) -> tuple[str, SourceLocation, SourceLocation | None] | None:
    """(node, forward line, the user's call around it) of the node of the failing graph that an earlier backward pass freed, nearest to
    where the graphs meet (the latest made); None when no earlier pass under this guard unpacked it.
    NOTE [Where a freed graph was made] (session.py)."""
    sites = session.node_sites
    if not sites or site.frame is None:
        return None
    receiver = _backward_receiver(site.code)
    loss = _lookup(receiver, site.frame) if receiver else None
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        return None
    # ``current``, ``latest``: the pass count and the latest backward line when the error arrived. Nodes the
    # failing backward itself ran (and freed) carry the latest pass. When that backward unpacked
    # nothing (its first saved tensor was already freed) the latest pass is the earlier backward's: the latest
    # backward line recorded is then not the failing one. In a loop both are one line: only older passes count.
    failing_unpacked = latest is None or site.location is None or (latest.file, latest.line) == (
        site.location.file, site.location.line)
    best = None
    for node in walk_nodes([loss.grad_fn], 5000):
        entry = sites.get((node.name(), node._sequence_nr()))
        if entry is None or entry[1] > current or (entry[1] == current and failing_unpacked) or not _freed(node):
            continue
        if best is None or node._sequence_nr() > best[0]:
            best = (node._sequence_nr(), node.name(), entry[0], entry[2])
    return best[1:] if best is not None else None


def _freed_nodes(root, limit: int = 5000) -> set:
    """Nodes of ``root``'s graph whose saved tensors are gone (freed by an earlier backward, or by the
    failing backward on its way to the freed part)."""
    return {node for node in walk_nodes([root], limit) if _freed(node)}


class _Crossing:
    """The tensor that crosses from the graph an earlier backward freed into the one backpropagated now."""

    def __init__(self, name: str, value, made: SourceLocation | None, used: SourceLocation | None,
                 callee: str | None):
        self.name, self.value, self.made, self.used, self.callee = name, value, made, used, callee


def _crossing_tensor(site: _Site, earlier: SourceLocation | None) -> _Crossing | None:
    """Find the user variable whose graph an earlier backward freed and that the failing loss depends on,
    where it was made, and (between that and the earlier backward) the call that fed it into that backward."""
    if site.frame is None or site.location is None:
        return None
    receiver = _backward_receiver(site.code)
    loss = _lookup(receiver, site.frame) if receiver else None
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        return None
    freed = _freed_nodes(loss.grad_fn)
    if not freed:
        return None
    filename, line = site.location.file, site.location.line
    candidates = list(_crossing_candidates(site, receiver, freed, earlier))
    if not candidates:
        return None
    _line, name, made, value = max(candidates, key=lambda c: c[:2])  # the latest: nearest to where graphs meet
    used, callee = None, None
    if made is not None and earlier is not None and earlier.file == filename:
        used, callee = _first_call_with(filename, made.line + 1, min(earlier.line, line), name)
    return _Crossing(name, value, made, used, callee)


def _crossing_candidates(site: _Site, receiver: str | None, freed: set, earlier: SourceLocation | None):
    """(line made, name, where made, tensor) for each graph-carrying variable in the failing frame whose graph
    reaches what an earlier backward freed, made before that backward ran."""
    scope = {**site.frame.f_globals, **site.frame.f_locals}
    filename, line = site.location.file, site.location.line
    # When the earlier backward is this statement in an earlier iteration, a tensor assigned unconditionally in
    # the loop body was recomputed since (a fresh graph); one assigned under an `if` (`if first is None: first =
    # out`) or outside the loop may still hold the old graph.
    every_iteration = _assigned_every_iteration(filename, line) if earlier is not None and (
        earlier.file, earlier.line) == (filename, line) else frozenset()
    for name, value, binding in _graph_tensors(scope):
        # State kept on a module (`self.hidden`) is replaced by every forward: its new value's graph runs back
        # through the old value into the freed graph.
        if name == receiver or (value.grad_fn not in freed and not (
                binding.startswith("self.") and _reaches_any(value.grad_fn, freed))):
            continue
        made = assignment_before(filename, line, binding)
        # The earlier backward can only have freed a graph that existed when it ran.
        if made is None or (earlier is not None and earlier.file == filename and made.line >= earlier.line):
            continue
        if made.line in every_iteration:
            continue  # recomputed in every iteration (a loop target, though, may hand out pieces of an old graph)
        yield made.line, name, made, value


def _crossing_by_graph(site: _Site, session):
    """NOTE [Finding the crossing by the graph] (crossing.py), from the failing backward's user frames outwards."""
    from .crossing import find_crossing

    import linecache

    frames, frame = [], site.frame
    while frame is not None and len(frames) < 32:
        if _is_user(frame.f_code.co_filename):
            frames.append(frame)
        frame = frame.f_back
    # The innermost user frame may be a custom Function's backward reading its freed ctx.saved_tensors: the
    # loss is the receiver in the first frame, outwards, whose line calls .backward().
    loss = None
    for index, frame in enumerate(frames):
        receiver = _backward_receiver(linecache.getline(frame.f_code.co_filename, frame.f_lineno))
        loss = _lookup(receiver, frame) if receiver else None
        if isinstance(loss, torch.Tensor):
            frames = frames[index:]
            break
    if not isinstance(loss, torch.Tensor):
        return None
    return find_crossing(loss, frames, list(getattr(session, "backward_calls", ())),
                         getattr(session, "node_sites", None) or {})


def _graph_tensors(scope: dict):
    """(name, tensor, how its assignment is written) for every tensor in ``scope`` that carries a graph: plain
    variables, and tensor attributes of modules in scope (``model.c``, assigned as ``self.c`` in a method)."""
    for name, value in scope.items():
        if isinstance(value, torch.Tensor) and value.grad_fn is not None:
            yield name, value, name
        elif isinstance(value, torch.nn.Module):
            for attribute, member in vars(value).items():
                if isinstance(member, (tuple, list)):  # an LSTM's (h, c) kept on the module
                    member = next((m for m in member if isinstance(m, torch.Tensor) and m.grad_fn is not None),
                                  None)
                if isinstance(member, torch.Tensor) and member.grad_fn is not None:
                    yield f"{name}.{attribute}", member, f"self.{attribute}"


def _assigned_every_iteration(filename: str, line: int) -> frozenset[int]:
    """Lines of the statements that run in every iteration of the innermost ``for``/``while`` around ``line``:
    its body's own statements and those of ``with`` blocks in it, not branches (``if``/``try``) or nested loops."""
    import ast

    tree = parse_file(filename)
    if tree is None:
        return frozenset()
    loop = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)) and node.lineno < line <= (node.end_lineno or 0):
            if loop is None or node.lineno > loop.lineno:
                loop = node
    if loop is None:
        return frozenset()
    lines: set[int] = set()
    pending = list(loop.body)
    while pending:
        statement = pending.pop()
        if not isinstance(statement, (ast.For, ast.AsyncFor)):  # a loop target may hand out old graphs' pieces
            lines.add(statement.lineno)
        if isinstance(statement, (ast.With, ast.AsyncWith)):
            pending.extend(statement.body)
    return frozenset(lines)


def _first_call_with(filename: str, start: int, stop: int, name: str):
    """The first statement in lines [start, stop) that passes ``name`` to a call, and the callee's text."""
    import ast
    import linecache

    for number in range(start, stop):
        code = linecache.getline(filename, number).strip()
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and any(isinstance(a, ast.Name) and a.id == name for a in node.args):
                return SourceLocation(filename, number, "", code), ast.unparse(node.func)
    return None, None


def _accumulated_without_reset(site: _Site, earlier):
    """(name, first accumulation, accumulation after the earlier backward, its loop) when the failing backward's
    loss accumulates across the earlier backward without a reset (corpus 061: SAM's two passes), else None."""
    if site.frame is None or site.location is None or earlier is None or earlier.file != site.location.file:
        return None
    receiver = _backward_receiver(site.code)
    if receiver is None or "." in receiver:
        return None
    statements = accumulations(site.location.file, receiver)
    before = [pair for pair in statements if pair[0].lineno < earlier.line]
    after = [pair for pair in statements if earlier.line < pair[0].lineno < site.location.line]
    if not before or not after:
        return None
    again, loop = after[0]
    if resets_between(site.location.file, receiver, earlier.line, again.lineno):
        return None
    return receiver, before[0][0], again, loop


def _is_expression_statement(code: str) -> bool:
    """``optimizer.backward(loss)``: a call whose value nothing reads (deleting it breaks no later name)."""
    import ast

    try:
        body = ast.parse(code).body
    except SyntaxError:
        return False
    return len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Call)


class _TwiceCase:
    """What the diagnosis of a backward through a freed graph gathers before it explains it."""

    def __init__(self, error, site: _Site, session):
        self.error, self.site, self.session = error, site, session
        self.location = site.location
        self.home = site.location.file if site.location is not None else None
        self.display: list = []
        self.fixes: list[FixIntent] = []
        self.saved_at = SaveSite()  # no autograd node saved anything here; only the accumulation rule names a line
        self.carried = self._carried()
        self.earlier = self._earlier(list(session.backward_sites) if session is not None else [])
        self.rule_name = "carried_state_backward_twice" if self.carried else "backward_twice"
        self.loss = self.receiver = None
        self.same_loss = self._same_loss()
        self.mechanism = self._mechanism()
        if self.mechanism is not None and self.mechanism.freed_by is not None:
            self.earlier = self.mechanism.freed_by
        self.hoisted = self._hoisted()
        self.crossing = self._crossing()

    def at(self, loc) -> str:
        return f"line {loc.line}" if self.home is not None and loc.file == self.home else loc.short

    def _carried(self) -> list:
        site = self.site
        if site.frame is None:
            return []
        scope = {**site.frame.f_globals, **site.frame.f_locals}
        return [c for c in carried_state(self.location) if _carries_graph(scope.get(c.name))]

    def _earlier(self, sites: list):
        # In a loop the earlier backward is the same line one iteration ago (carried state); otherwise the
        # failing backward is recorded too (it unpacked its new graph before reaching the freed one), so the
        # earlier backward is the latest one on another line.
        earlier = sites[-1] if sites else None
        location = self.location
        if not self.carried and location is not None:
            earlier = next((s for s in reversed(sites) if (s.file, s.line) != (location.file, location.line)), earlier)
        return earlier

    def _searching(self) -> bool:
        """Whether the graph of the failing loss is still to be read (no carried state explains it)."""
        return not self.carried and self.site.frame is not None and self.session is not None

    def _same_loss(self):
        if not self._searching():
            return None
        site = self.site
        try:  # NOTE [The same loss backpropagated twice]
            self.receiver = _backward_receiver(site.code)
            self.loss = _lookup(self.receiver, site.frame) if self.receiver else None
            if isinstance(self.loss, torch.Tensor):
                return second_call_of_same_loss(list(getattr(self.session, "backward_calls", ())), self.loss,
                                                raised_chain(self.error.__traceback__))
        except Exception as problem:
            log_fallback("torch.eager", "comparing the backward calls", problem)
        return None

    def _mechanism(self):
        if self.same_loss is not None or not self._searching():
            return None
        try:  # NOTE [Finding the crossing by the graph]
            return _crossing_by_graph(self.site, self.session)
        except Exception as problem:
            log_fallback("torch.eager", "following the graph to the part an earlier backward freed", problem)
        return None

    def _hoisted(self):
        location, earlier, mechanism = self.location, self.earlier, self.mechanism
        if (self.carried or self.same_loss is not None or self.site.frame is None or location is None
                or (mechanism is not None and mechanism.holder != "loss")
                or earlier is None or (earlier.file, earlier.line) != (location.file, location.line)):
            return None
        try:  # NOTE [A forward made once, before the loop that backpropagates it]
            return forward_before_loop(self.site.frame, location.line)
        except Exception as problem:
            log_fallback("torch.eager", "looking for a forward made before the loop", problem)
        return None

    def _crossing(self) -> _Crossing | None:
        mechanism, earlier, location = self.mechanism, self.earlier, self.location
        if mechanism is not None and mechanism.tensor is not None and self.hoisted is None:
            crossing = _Crossing(mechanism.name, mechanism.tensor, mechanism.made, None, None)
            crossing.holder = mechanism.holder
            made = mechanism.made
            if (mechanism.holder == "variable" and made is not None and earlier is not None and location is not None
                    and made.file == earlier.file == location.file):
                crossing.used, crossing.callee = _first_call_with(made.file, made.line + 1,
                                                                  min(earlier.line, location.line), mechanism.name)
            return crossing
        if self.carried or self.hoisted is not None or self.same_loss is not None:
            return None
        try:
            return _crossing_tensor(self.site, earlier)
        except RuntimeError:  # reading the graph failed: the plain diagnosis below still stands
            return None


def _explain_carried(case: _TwiceCase):
    site, at, earlier, location = case.site, case.at, case.earlier, case.location
    state = case.carried[0]
    value = site.frame.f_locals.get(state.name, site.frame.f_globals.get(state.name))
    is_tuple = isinstance(value, (tuple, list))
    first = value[0] if is_tuple else value
    tensor = TensorInfo(shape=tuple(first.shape), dtype=str(first.dtype).replace("torch.", ""),
                        device=str(first.device), name=f"{state.name}[0]" if is_tuple else state.name,
                        role="carried state",
                        producer=first.grad_fn.name() if first.grad_fn is not None else None)
    kind_of = f"a tuple of {len(value)} tensors" if is_tuple else "a tensor"
    case.display.insert(0, ("carried by", f"`{state.name}` ({kind_of}), assigned at {at(state.assignment)}: "
                                          f"{state.assignment.code}"))
    why = (f"`{state.name}` carries the previous iteration's output into this one without .detach(), so this "
           f"backward at {at(location)} runs on into the previous iteration's graph. The previous backward "
           f"{'at ' + at(earlier) + ' ' if earlier else ''}already freed that graph's saved tensors (backward "
           f"frees them unless retain_graph=True).")
    fix = (f"Detach the carried state: {state.detach_fix(is_tuple)}. Each backward then covers only its own "
           f"iteration (truncated backpropagation through time). Do not add retain_graph=True to silence this: "
           f"it keeps every iteration's graph alive, and the next optimizer step turns it into \"modified by "
           f"an inplace operation\".")
    case.fixes.append(state.detach_intent(is_tuple))
    return tensor, why, fix


def _explain_same_loss(case: _TwiceCase):
    site, at, location, receiver = case.site, case.at, case.location, case.receiver
    first, path, again = case.same_loss
    tensor = _describe(case.loss, receiver)  # both read above, where same_loss was found
    called = f" (called from {at(path)})" if (path.file, path.line) != (first.file, first.line) else ""
    case.display[:0] = [("freed by", f"the backward of the same `{receiver}` at {at(first)}{called}: {first.code}"),
                        ("again", f"at {at(again)}: {again.code}")]
    through = f" (through `{site.code}` at {at(location)})" if (again.file, again.line) != (
        location.file, location.line) else ""
    why = (f"The same `{receiver}` is backpropagated twice{through}: `{first.code}` at {at(first)}{called} "
           f"already ran its backward, which freed the saved tensors of its graph, and `{again.code}` at "
           f"{at(again)} backpropagates it again.")
    fix = (f"Backpropagate each loss once: delete `{again.code}` at {at(again)}; the call at {at(first)} already "
           f"computed its gradients. retain_graph=True would only hide it: the second backward would add the "
           f"same gradients again.")
    code = statement_code(again)
    if _is_expression_statement(code):
        case.fixes.append(FixIntent("remove_statement", again.file, again.line, target=code,
                                    reason=f"`{receiver}` is already backpropagated at {at(first)}"))
    case.rule_name = "same_loss_backward_twice"
    return tensor, why, fix


def _explain_hoisted(case: _TwiceCase):
    at, location, hoisted = case.at, case.location, case.hoisted
    name, lines = hoisted["name"], (f"line {hoisted['first']}" if hoisted["first"] == hoisted["last"]
                                    else f"lines {hoisted['first']}-{hoisted['last']}")
    tensor = _describe(_lookup(name, case.site.frame), name)
    case.display.insert(0, ("made", f"`{name}` once, before the loop ({lines})"))
    why = (f"`{name}` is made once, before the loop ({lines}), and backpropagated in every iteration at "
           f"{at(location)}: the first backward frees the saved tensors of its graph, and the next iteration "
           f"backpropagates the same graph again.")
    fix = (f"Run the forward inside the loop: {lines} again before line {hoisted['line']}, so every iteration "
           f"backpropagates a graph of its own (and sees the updated weights). retain_graph=True would only "
           f"hide it: every iteration would reuse the first forward's values.")
    case.fixes.append(FixIntent("insert_before", location.file, hoisted["line"], target=name,
                                detail={"code": hoisted["code"]},
                                reason=f"the forward ({lines}) runs in every iteration, so each backward has its own "
                                       f"graph"))
    case.rule_name = "forward_outside_loop"
    case.saved_at = SaveSite(location=SourceLocation(location.file, hoisted["first"], location.function))
    return tensor, why, fix


def _explain_crossing(case: _TwiceCase):
    site, at, earlier, location, crossing = case.site, case.at, case.earlier, case.location, case.crossing
    value = crossing.value
    tensor = TensorInfo(shape=tuple(value.shape), dtype=str(value.dtype).replace("torch.", ""),
                        device=str(value.device), name=crossing.name, role="activation",
                        producer=value.grad_fn.name() if value.grad_fn is not None else None)
    made = crossing.made
    if made is not None:
        case.display.insert(0, ("crosses", f"`{crossing.name}`, made at {at(made)}: {made.code}"))
    freed_by = f"the backward at {at(earlier)} (`{earlier.code}`)" if earlier is not None else "an earlier backward"
    fed = (f" `{crossing.used.code}` ({at(crossing.used)}) fed `{crossing.name}` into that backward's graph "
           f"without .detach(), so" if crossing.used is not None else "")
    why = (f"`{crossing.name}`{' (made at ' + at(made) + ')' if made else ''} belongs to a graph that "
           f"{freed_by} already went through and freed:{fed} that backward ran on into the graph that made "
           f"`{crossing.name}`. The backward at {at(location)} (`{site.code}`) reaches that graph again "
           f"through `{crossing.name}` and finds its saved tensors gone.")
    if getattr(crossing, "holder", None) == "module attribute":
        why, fix = _module_state_fix(case, freed_by)
    elif crossing.used is not None and crossing.callee:
        fix = (f"Detach it where the earlier loss uses it: `{crossing.callee}({crossing.name}.detach())` at "
               f"{at(crossing.used)}, so the earlier backward stops at `{crossing.name}` and leaves its graph "
               f"for the backward at {at(location)}.")
        case.fixes.append(FixIntent("detach_argument", crossing.used.file, crossing.used.line,
                                    target=crossing.name, detail={"call": crossing.callee},
                                    reason=f"the backward at {at(earlier) if earlier else 'the earlier line'} then "
                                           f"stops at `{crossing.name}`"))
    else:
        fix = (f"Detach `{crossing.name}` where an earlier loss uses it (`{crossing.name}.detach()`), or "
               f"recompute it after the earlier backward, so each backward covers its own graph.")
        if made is not None:
            fix += _detach_where_made(case)
    case.rule_name = "freed_graph_reused"
    return tensor, why, fix


def _module_state_fix(case: _TwiceCase, freed_by: str):
    """(why, fix) for state a module keeps between forwards that still holds a freed graph."""
    at, location, crossing, mechanism = case.at, case.location, case.crossing, case.mechanism
    made = crossing.made
    # NOTE [Finding the crossing by the graph]: state a module keeps between forwards (a membrane, a
    # hidden state) still holds the previous iteration's graph when the next forward starts from it.
    held = (f"`{mechanism.binding}` of {crossing.name}" if mechanism.binding
            else crossing.name)  # `net.1.mem` is no Python expression: the path stays plain text
    why = (f"{held} is state the module keeps from one forward to the next"
           f"{' (assigned at ' + at(made) + ')' if made else ''}. It still holds the graph of the previous "
           f"iteration, which {freed_by} already went through and freed; this iteration's forward starts "
           f"from it, so the backward at {at(location)} (`{case.site.code}`) runs on into that freed graph.")
    binding = mechanism.binding or ""
    several = made is not None and len(assigned_names(statement_code(made))) > 1  # `out, self.h = ...`
    if several and binding in assigned_names(statement_code(made)):
        # a tuple target cannot take `.detach()` on its right-hand side: detach the state on the next line
        detach_code = f"{binding} = {binding}.detach()"
        detached = None
        how = f", or detach it right after it is made: insert `{detach_code}` after {at(made)}"
    else:
        detach_code = None
        detached = _clone_assignment(statement_code(made), "detach") if made is not None else None
        how = f", or detach it where it is made: `{detached}` ({at(made)})" if detached else ""
    fix = ("Reset the state before each new sequence (set it to a fresh tensor, as a `reset()` or "
           "`reset_net(model)` after the optimizer step does)" + how
           + ". retain_graph=True would only hide it: every iteration would backpropagate into all earlier "
             "ones.")
    reason = (f"`{binding}` carries values into the next batch, not its graph" if binding
              else f"{held} carries values into the next iteration, not its graph")
    if detach_code is not None:
        case.fixes.append(FixIntent("insert_after", made.file, made.line, target=binding,
                                    detail={"code": detach_code}, reason=reason))
    elif detached is not None:
        case.fixes.append(FixIntent("detach_assignment", made.file, made.line, target=binding, reason=reason))
    return why, fix


def _detach_where_made(case: _TwiceCase) -> str:
    """The sentence (and intent) that detaches the crossing tensor at the statement that made it."""
    at, crossing, site = case.at, case.crossing, case.site
    made = crossing.made
    target = next((t for t in assigned_names(statement_code(made)) if t in (crossing.name, "self." +
                   crossing.name.rsplit(".", 1)[-1])), None)
    detached = _clone_assignment(statement_code(made), "detach")
    several = len(assigned_names(statement_code(made))) > 1  # `out, self.hidden = self.lstm(...)`
    whole = _lookup(crossing.name, site.frame) if site.frame is not None else None
    if target is not None and (several or isinstance(whole, (tuple, list))):
        detach_code = (f"{target} = tuple(h.detach() for h in {target})"
                       if isinstance(whole, (tuple, list)) else f"{target} = {target}.detach()")
        case.fixes.append(FixIntent("insert_after", made.file, made.line, target=target,
                                    detail={"code": detach_code},
                                    reason=f"`{target}` carries values into the next batch, not its graph"))
        return (f" If it is state carried from one batch to the next (a recurrent hidden state), detach "
                f"it right after it is made: insert `{detach_code}` after {at(made)}.")
    if target is not None and detached is not None:
        case.fixes.append(FixIntent("detach_assignment", made.file, made.line, target=target,
                                    reason=f"`{target}` is a value for later losses, not a path for their "
                                           f"gradients"))
        return (f" If later losses only need its value (a constant such as a target, a centre or old "
                f"log-probabilities), detach it where it is made: `{detached}` ({at(made)}).")
    return ""


def _explain_accumulated(case: _TwiceCase, receiver, first, again, loop):
    at, earlier, location = case.at, case.earlier, case.location
    value = _lookup(receiver, case.site.frame)
    tensor = _describe(value, receiver)
    saver = SourceLocation(location.file, first.lineno, location.function)  # code read on first use
    case.display.insert(0, ("accumulates", f"`{receiver}` at {at(saver)}, and again at line {again.lineno} without "
                                           f"a reset in between"))
    why = (f"`{receiver}` accumulates losses ({at(saver)}) and is backpropagated at {at(earlier)}, which frees "
           f"that graph's saved tensors; it is not reset afterwards, so line {again.lineno} adds the next "
           f"losses to the same `{receiver}`, and the backward at {at(location)} runs through the freed graph "
           f"again.")
    reset_line = loop.lineno if loop is not None else again.lineno
    fix = (f"Reset the accumulator before accumulating again: insert `{receiver} = 0` before line {reset_line}, "
           f"so each backward covers only its own losses.")
    case.fixes.append(FixIntent("insert_before", location.file, reset_line, target=receiver,
                                detail={"code": f"{receiver} = 0"},
                                reason=f"the backward at {at(location)} then covers only the losses added after it"))
    case.rule_name = "accumulated_loss_not_reset"
    case.saved_at = SaveSite(location=saver)
    return tensor, why, fix


def _explain_unknown(case: _TwiceCase):
    site = case.site
    receiver = _backward_receiver(site.code)
    value = _lookup(receiver, site.frame) if receiver and site.frame is not None else None
    tensor = (_describe(value, receiver) if isinstance(value, torch.Tensor)
              else TensorInfo(shape=(), dtype="unknown dtype", name=receiver, role="graph"))
    why = ("An earlier backward freed the saved tensors of part of this graph (backward frees them unless "
           "retain_graph=True). This backward reaches that part again: usually a tensor from a previous "
           "iteration (an RNN hidden state, a running average, a cached embedding) was carried into this "
           "iteration without .detach(), or the same loss is backpropagated twice.")
    fix = ("Detach what you carry across iterations (`h = h.detach()`), so each backward only covers its own "
           "iteration. Pass retain_graph=True to the earlier backward only if you really need to backpropagate "
           "through the same graph twice (and then do not step the optimizer in between).")
    return tensor, why, fix


def _explain_twice(case: _TwiceCase):
    """(tensor, why, fix) of the first explanation that fits, in order of how much each one knows."""
    if case.carried:
        return _explain_carried(case)
    if case.same_loss is not None:
        return _explain_same_loss(case)
    if case.hoisted is not None:
        return _explain_hoisted(case)
    if case.crossing is not None:
        return _explain_crossing(case)
    accumulated = _accumulated_without_reset(case.site, case.earlier)
    if accumulated is not None:
        return _explain_accumulated(case, *accumulated)
    return _explain_unknown(case)


def _twice_saved_at(case: _TwiceCase, passes) -> SaveSite:
    """Where the freed graph was made: the node an earlier pass freed, or the line that made the crossing tensor."""
    saved_at, crossing = case.saved_at, case.crossing
    made_crossing = crossing is not None and crossing.made is not None and saved_at.location is None
    if saved_at.location is None and case.session is not None:
        try:
            freed = _freed_saver(case.site, case.session, *passes)
        except Exception as problem:  # only a detail of the diagnosis
            log_fallback("torch.eager", "naming the forward of the freed graph", problem)
            freed = None
        if freed is not None:  # shown as "saved by", above the "freed by" row
            saved_at = SaveSite(node=freed[0], location=freed[1], chain=[freed[2]] if freed[2] is not None else [])
    if made_crossing and (saved_at.location is None or (saved_at.location.file, saved_at.location.line) != (
            crossing.made.file, crossing.made.line)):
        saved_at = SaveSite(location=crossing.made)  # the line that made the tensor crossing into the freed graph
    return saved_at


def _backward_twice(error, session) -> Finding:
    site = _Site(error)
    # read before anything below walks the graph: reading a live node's saved tensor runs the unpack hook
    passes = (session.ledger.backward_passes, session.backward_sites[-1] if session.backward_sites else None) if (
        session is not None) else None
    case = _TwiceCase(error, site, session)
    earlier, location = case.earlier, site.location
    if earlier is not None and case.same_loss is None:
        case.display.append(("freed by", f"the earlier backward at {case.at(earlier)}: {earlier.code}"))
    tensor, why, fix = _explain_twice(case)
    saved_at = _twice_saved_at(case, passes)
    # The earlier backward is what made this graph unusable: the "write" of this kind, in the JSON too.
    freed_by = case.same_loss[0] if case.same_loss is not None else earlier
    writes = [WriteRecord(op="backward", location=freed_by, via="the earlier backward, which freed the saved tensors",
                          category="backward")] if freed_by is not None else []
    finding = Finding(
        kind="backward_twice",
        tensor=tensor,
        saved_at=saved_at,
        modified_at=writes,
        explanation=why,
        suggestion=fix,
        rule=case.rule_name,
        fixes=case.fixes,
        facts=Facts(display=case.display, torch_message=str(error)),
    )
    finding.facts.backward_at = location.to_dict() if location else None  # after the message, as JSON always had it
    return diagnose(finding)
