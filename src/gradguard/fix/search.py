"""The general repair search of ``gradguard fix``: candidate edits read from the write and the save of a finding
(its lines, the op, the module that wrote), whatever rule diagnosed it.

# NOTE [Repairs from the mechanism, not the rule id]
# A rule's own intents are tried first (it knows its case best), then the candidates any write-into-saved-tensor
# finding has, in order of how little they change:
#   (a) the write made out of place: `x.div_(n)` -> `x = x.div(n)` (when the tensor type has that method, see
#       NOTE [Out-of-place methods come from the framework]), `x += y` -> `x = x + y`, `x[m] = v` ->
#       `x = x.masked_fill(m, v)`, `F.relu(x, inplace=True)` -> `x = F.relu(x)`; else a clone written into
#       instead (`x = x.clone()` before the write); in a function registered as a hook, the new value returned;
#   (b) `inplace=False` where the module instance that wrote was constructed (NOTE [Resolving the writing
#       instance to its construction]; the instance is the write's `via`, from the module stack for a write into a
#       saved tensor, from the traceback for one autograd refused on the spot), or the later `m.inplace = True`
#       removed;
#   (c) a copy at the save point (the saved input cloned, or the saved output's variable bound to a clone); for a
#       write into a loop's variable, the items of the container the loop walks copied before the loop;
#   (d) a detach where the tensor crosses into a graph an earlier backward freed (where it is assigned, else where a
#       call reads it before that backward);
#   (e) an update of weights (an optimizer step, or any write into a parameter) moved after the backward that
#       still needs the values it changed, as the statement of that backward's block that holds it;
#   (f) retain_graph=True on an earlier backward (or `autograd.grad`) whose graph a later loss of the same forward
#       shares, or on a backward in a loop through a tensor made once before the loop (before (d): it keeps every
#       gradient the code asks for, where a detach drops one);
#   (g) that tensor made again at the top of the loop instead (the only candidate of the two when a step in the loop
#       changes what made it: a retained graph would backpropagate through the first iteration's values every
#       time).
# Each candidate is verified by a run like any rule's intent; none is ever needed by a rule id to exist.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
from typing import Callable

from ..core.facts import Facts
from ..core.fixes import assigned_names, carried_reads, innermost, items_copied_before_loop, reads
from ..core.intents import FixIntent

__all__ = ["general_repairs", "same_intent", "rebinds_a_lost_name"]

# At most this many general candidates per finding: each costs a run of the script.
_MAX_CANDIDATES = 8


def same_intent(a: FixIntent, b: FixIntent) -> bool:
    """The same edit (the reason and the grouping aside)."""
    strip = lambda d: {k: v for k, v in d.items() if k != "group"}  # noqa: E731
    return (a.action, a.file and os.path.realpath(a.file), a.line, a.target, strip(a.detail)) == (
        b.action, b.file and os.path.realpath(b.file), b.line, b.target, strip(b.detail))


def _prime(sources: dict[str, str]) -> None:
    """Make linecache (which the source readers use) return the edited text of each overlaid file: the lines of a
    later round's finding refer to it."""
    for path, text in sources.items():
        lines = text.splitlines(keepends=True)
        linecache.cache[path] = (len(text), None, lines, path)


def _statement(file: str, line: int) -> tuple[ast.stmt, str] | None:
    from ..core.source_ast import statement_at

    stmt = statement_at(file, line)
    if stmt is None:
        return None
    lines = linecache.getlines(file)[stmt.lineno - 1:stmt.end_lineno or stmt.lineno]
    return stmt, "".join(lines)


def _receivers(stmt: ast.stmt) -> list[str]:
    """What the statement writes in place, the written tensor first and then what holds it: ``x`` in
    ``x.normal_()``, ``x[i] = v``, ``x += 1``, ``torch.relu_(x)``; ``hs[0]``, then ``hs``, in ``hs[0].mul_(2)``
    (the element of a list, or a row of a tensor: which one is known only when the edit runs)."""
    target = None
    if isinstance(stmt, ast.AugAssign):
        target = stmt.target
    elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript):
        target = stmt.targets[0].value
    else:
        target = next((t for n in ast.walk(stmt) if isinstance(n, ast.Call) for t in [_inplace_target(n)]
                       if t is not None), None)
        while isinstance(target, ast.Call) and _inplace_target(target) is not None:  # `x.mul_(s).add_(m)`
            target = _inplace_target(target)
    found = []
    while isinstance(target, ast.Subscript):
        found.append(ast.unparse(target))
        target = target.value
    return [*found, ast.unparse(target)] if isinstance(target, (ast.Name, ast.Attribute)) else []


_FUNCTIONS = ("torch", "F", "nn")  # modules whose in-place functions write their first argument


def _inplace_target(call: ast.Call) -> ast.expr | None:
    """What an in-place call writes: the receiver of ``x.mul_(2)``, the first argument of ``torch.relu_(x)`` or
    ``F.relu(x, inplace=True)``; None for a call that writes nothing in place."""
    if not isinstance(call.func, ast.Attribute):
        return None
    name = call.func.attr
    if not ((name.endswith("_") and not name.endswith("__")) or any(k.arg == "inplace" for k in call.keywords)):
        return None
    base = root = call.func.value
    while isinstance(root, ast.Attribute):  # `torch.nn.functional.relu(x, inplace=True)`
        root = root.value
    if isinstance(root, ast.Name) and root.id in _FUNCTIONS:
        return call.args[0] if call.args else None
    return base


_REBINDING = ("inplace_to_out_of_place", "augmented_to_binary", "insert_before", "set_keyword")


def rebinds_a_lost_name(intent: FixIntent) -> bool:
    """Whether ``intent`` makes a write out of place (or into a clone) by rebinding a name nothing reads after the
    write, where the written tensor is someone else's: the variable of the loop around it (``for p in parts: p =
    p.mul(0.5)`` changes neither ``parts`` nor anything else) or a parameter of the function it is in (``def
    update(t): t = t.mul(2)`` leaves the caller's tensor as it was). The write is dropped and the script runs
    clean with other numbers, so such a candidate is not tried (NOTE [Repairs from the mechanism, not the rule
    id])."""
    found = _rebound(intent)
    if found is None or intent.detail.get("returned") or isinstance(found[0], ast.Return):
        return False  # `return t.renorm_(...)` becomes `t = t.renorm(...)`, `return t`: the value reaches the caller
    from ..core.source_ast import parse_file

    (stmt, name), tree = found, parse_file(intent.file or "")
    line = intent.line or 0
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef))
              and n.lineno < line <= (n.end_lineno or n.lineno)] if tree is not None else []
    scope = max(scopes, key=lambda n: n.lineno, default=None)
    if scope is None or name not in _bound_by(scope):
        return False
    end = stmt.end_lineno or line
    return not any(isinstance(n, ast.Name) and n.id == name and n.lineno > end for n in ast.walk(scope))


def _rebound(intent: FixIntent) -> tuple[ast.stmt, str] | None:
    """(the statement, the plain name ``intent``'s edit rebinds there), or None when it rebinds none."""
    found = _statement(intent.file, intent.line) if intent.action in _REBINDING and intent.file and intent.line \
        else None
    receivers = _receivers(found[0]) if found else []
    if found is None or len(receivers) != 1 or not receivers[0].isidentifier():
        return None
    if intent.action == "set_keyword" and not isinstance(found[0], ast.Expr):
        return None  # `return F.relu(t, inplace=False)`, `y = F.relu(t, inplace=False)`: nothing is rebound
    return found[0], receivers[0]


def _bound_by(scope: ast.AST) -> set[str]:
    """The names a loop binds to its items, or a function to its arguments."""
    if isinstance(scope, (ast.For, ast.AsyncFor)):
        return {n.id for n in ast.walk(scope.target) if isinstance(n, ast.Name)}
    arguments = scope.args  # type: ignore[attr-defined]  # a function
    return {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}


def _line_names(tree: ast.AST, line: int) -> set[str]:
    """The variable names the simple statements on ``line`` read: all of them, for `opt.zero_grad(); loss.backward()`
    puts the backward after a `;`."""
    return {n.id for stmt in ast.walk(tree) if isinstance(stmt, ast.stmt) and stmt.lineno == line
            and not hasattr(stmt, "body") for n in ast.walk(stmt) if isinstance(n, ast.Name)}


def _write_candidates(write: dict) -> list[list[FixIntent]]:
    """(a): the write at ``write``'s line out of place, else into a clone."""
    file, line = write.get("file"), write.get("line")
    found = _statement(file, line) if file and line else None
    if found is None:
        return []
    stmt, code = found
    where = (file, line)
    repairs: list[list[FixIntent]] = []
    from ..core.fixes import mask_assignment, out_of_place

    flat = " ".join(code.split())
    masked = mask_assignment(flat)
    rewritten = masked or out_of_place(flat)
    if rewritten:
        action = "augmented_to_binary" if isinstance(stmt, ast.AugAssign) else "inplace_to_out_of_place"
        detail = {"method": "masked_fill"} if masked else {}
        repairs.append([FixIntent(action, *where, target=rewritten.split(" = ", 1)[0], detail=detail,
                                  reason=f"`{rewritten}` makes a new tensor and leaves the saved one intact")])
    standing = None if masked else out_of_place(flat, stands=True)
    if standing and standing != rewritten:  # `g = hs[0].exp_()` where hs[0] cannot be rebound (a tuple's)
        repairs.append([FixIntent("inplace_to_out_of_place", *where, target=standing.split(" = ", 1)[0],
                                  detail={"stands": True},
                                  reason=f"`{standing}` makes a new tensor and leaves the saved one intact")])
    for receiver in _receivers(stmt) if not isinstance(stmt, ast.AugAssign) else ():
        repairs.append([FixIntent("insert_before", *where, target=receiver,
                                  detail={"code": f"{receiver} = {receiver}.clone()"},
                                  reason=f"the write then changes a copy of `{receiver}`; backward keeps the "
                                         f"saved values")])
    return repairs


def _returned_candidates(write: dict, repairs: list[list[FixIntent]]) -> list[list[FixIntent]]:
    """(a) in a hook: a function registered as a hook (``net[1].register_forward_hook(scale)``) that writes its
    argument in place and returns nothing makes the write out of place and returns the new value: torch uses a
    hook's return value in place of the module's output."""
    hook = _hook_writing(write)
    if hook is None:
        return []
    last = hook.body[-1].lineno
    return [[FixIntent(first.action, first.file, first.line, target=first.target,
                       detail={**first.detail, "returned": True}, reason=first.reason),
             FixIntent("insert_after", first.file, last, target=first.target,
                       detail={"code": f"return {first.target}"},
                       reason=f"the hook `{hook.name}` hands the new value on: torch uses what a hook returns")]
            for first, *rest in repairs if not rest and first.action in ("inplace_to_out_of_place",
                                                                         "augmented_to_binary")
            and first.target in _bound_by(hook)]


def _copied_items_candidates(finding: dict, write: dict) -> list[list[FixIntent]]:
    """(c) for a write into a loop's variable (``for p in parts: p.mul_(0.5)``), where rebinding ``p`` would drop
    the write: the items of the container copied just before the loop, so it writes the copies the code reads after
    it instead of tensors autograd saved or handed out as views of one tensor. Never for weights: their update
    would go to copies."""
    if (finding.get("tensor") or {}).get("role") in ("parameter", "buffer") or write.get("category") == "optimizer":
        return []
    file, line = write.get("file"), write.get("line") or 0
    found = _statement(file, line) if file and line else None
    receivers = _receivers(found[0]) if found else []
    copied = items_copied_before_loop(file, line, receivers[-1]) if receivers and receivers[-1].isidentifier() \
        else None
    return [[copied]] if copied is not None else []


def _hook_writing(write: dict) -> ast.FunctionDef | None:
    """The function ``write`` is in when it returns no value and a ``register_*hook`` call of its file passes it."""
    from ..core.source_ast import parse_file

    file, line, function = write.get("file"), write.get("line") or 0, write.get("function")
    tree = parse_file(file) if file and function else None
    hook = innermost(tree, line, (ast.FunctionDef,)) if tree is not None else None
    if not isinstance(hook, ast.FunctionDef) or hook.name != function or hook.lineno == line or any(
            isinstance(n, ast.Return) and n.value is not None for n in ast.walk(hook)):
        return None
    return hook if _passed_to_a_hook(tree, function) else None


def _passed_to_a_hook(tree: ast.AST, function: str) -> bool:
    """Whether a call of a ``...hook`` method or function (``register_forward_hook``) passes ``function``."""
    return any(isinstance(n, ast.Call) and "hook" in ast.unparse(n.func).split(".")[-1]
               and any(isinstance(a, ast.Name) and a.id == function for a in n.args) for n in ast.walk(tree))


def _module_candidates(write: dict, files: list[str]) -> list[list[FixIntent]]:
    """(b): ``inplace=False`` where the instance that wrote was built; the later switch to in-place removed."""
    from ..core.module_sites import inplace_parameter_calls, inplace_position, split_module_via, writer_sites

    found = writer_sites(files, write.get("via"))
    if found is None:
        return []
    path, kind = split_module_via(write.get("via"))
    sites, switches, _resolved = found
    repairs = [[FixIntent("remove_statement", s.file, s.line, target=s.code,
                          reason=f"`{s.code}` made {path or kind} write in place")] for s in switches]
    position = inplace_position(kind)
    for site in sites:
        detail = {"call": kind, "keyword": "inplace", "value": False}
        if site.occurrence is not None:
            detail["occurrence"] = site.occurrence
        if position is not None and "inplace=" not in site.location.code:  # `nn.ReLU(True)`
            detail["position"] = position
        repairs.append([FixIntent("set_keyword", site.location.file, site.location.line, detail=detail,
                                  reason=f"construct {path or kind} with inplace=False")])
    # the user's own class or factory that built it takes `inplace` (torchvision's MLP(..., inplace=True))
    for location, callee in inplace_parameter_calls(files, write["file"], write["line"]):
        repairs.append([FixIntent("set_keyword", location.file, location.line,
                                  detail={"call": callee, "keyword": "inplace", "value": False, "add": True},
                                  reason=f"build {callee} with inplace=False, so the {kind} it makes does not "
                                         f"write in place")])
    return repairs


def _called_module_candidates(write: dict, files: list[str]) -> list[list[FixIntent]]:
    """(b) for a write reported without the module that made it: a module called on the write's line that was
    constructed with inplace=True gets inplace=False; else its argument is handed over as a clone."""
    from ..core.module_sites import called_inplace_modules

    if write.get("via"):
        return []
    found = called_inplace_modules(files, write["file"], write["line"])
    repairs = []
    for site, kind, _call in found:
        detail = {"call": kind, "keyword": "inplace", "value": False}
        if site.occurrence is not None:
            detail["occurrence"] = site.occurrence
        repairs.append([FixIntent("set_keyword", site.location.file, site.location.line, detail=detail,
                                  reason=f"construct the {kind} called at line {write['line']} with inplace=False")])
    for _site, _kind, call in found:
        callee = ast.unparse(call.func)
        for argument in call.args:
            if isinstance(argument, (ast.Name, ast.Attribute)):
                name = ast.unparse(argument)
                repairs.append([FixIntent("clone_argument", write["file"], write["line"], target=name,
                                          detail={"call": callee},
                                          reason=f"`{callee}` then writes into a copy of `{name}`")])
    return repairs


def _save_candidates(finding: dict, receivers: list[str]) -> list[list[FixIntent]]:
    """(c): a copy at the save point, of the tensor the writes changed."""
    saved = finding.get("saved_at") or {}
    file, line = saved.get("file"), saved.get("line")
    found = _statement(file, line) if file and line else None
    tensor = (finding.get("tensor") or {}).get("name")
    names = [n for n in dict.fromkeys((*receivers, tensor)) if n]
    if found is None or not names:
        return []
    stmt, _code = found
    repairs = []
    if saved.get("argument") == "result" and isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        # the op saved its own output: what the assignment binds is that output, whatever the write calls it later
        # (`h = torch.tanh(...)`, returned in a tuple and written as `encoder_out[0][...]`)
        names += [ast.unparse(stmt.targets[0])] if isinstance(stmt.targets[0], (ast.Name, ast.Attribute)) else []
    names += [read for read in _operands(stmt) if read not in names]
    written = _written_in(stmt)
    for name in [n for n in names if n not in written]:  # a clone of what the statement writes would drop the write
        repairs += _save_copy(stmt, saved, name)
    return repairs


def _save_copy(stmt: ast.stmt, saved: dict, name: str) -> list[list[FixIntent]]:
    """The saved output assigned to ``name`` made a copy, or ``name`` read by the saver cloned there."""
    where = (saved.get("file"), saved.get("line"))
    if saved.get("argument") == "result" and isinstance(stmt, ast.Assign) and any(
            ast.unparse(t) == name for t in stmt.targets):
        return [[FixIntent("clone_assignment", *where, target=name,
                           reason=f"`{name}` becomes a copy; the output backward saved stays intact")]]
    if reads(getattr(stmt, "value", None) or stmt, name):
        return [[FixIntent("clone_expression", *where, target=name,
                           reason=f"backward saves a copy of `{name}`, which the write cannot change")]]
    return []


_NAMESPACES = {"torch", "F", "nn", "np", "math", "self"}
_MAX_OPERANDS = 4


def _operands(stmt: ast.stmt) -> list[str]:
    """The plain reads of ``stmt``'s value, outermost first (``out[t - 1]``, not ``out`` or ``t``), leaving out
    callees (what the statement writes is left out by its caller, :func:`_written_in`). Cloning a read never
    changes a value or a gradient, so each is a safe candidate for the copy at the save point; the verifying run
    says which one the saver kept."""
    value = getattr(stmt, "value", None)
    if value is None:
        return []
    callees = {id(n.func) for n in ast.walk(value) if isinstance(n, ast.Call)}
    inner: set[int] = set(callees)
    for node in ast.walk(value):
        if isinstance(node, ast.Subscript):
            inner |= {id(node.value)} | {id(n) for n in ast.walk(node.slice)}
        elif isinstance(node, ast.Attribute) and id(node) not in callees:  # `h` in `h.pow(2)` is read; in `h.w`, not
            inner.add(id(node.value))
    reads = [ast.unparse(n) for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute, ast.Subscript))
             and id(n) not in inner and not any(isinstance(c, ast.Call) for c in ast.walk(n))]
    return [r for r in dict.fromkeys(reads) if r not in _NAMESPACES][:_MAX_OPERANDS]


def _written_in(stmt: ast.stmt) -> set[str]:
    """Every expression inside what ``stmt`` writes in place (the receiver of an in-place call, the target of an
    item assignment): ``out[t]``, ``out`` and ``t`` in ``out[t].copy_(v)``. A clone there drops the write."""
    roots = [t for n in ast.walk(stmt) if isinstance(n, ast.Call) for t in [_inplace_target(n)] if t is not None]
    roots += [t for t in getattr(stmt, "targets", ()) if isinstance(t, ast.Subscript)]
    roots += [stmt.target] if isinstance(stmt, ast.AugAssign) else []
    return {ast.unparse(n) for root in roots for n in ast.walk(root)}


def _backward_at(finding: dict) -> dict:
    """Where the JSON finding's backward was called (a ``SourceLocation.to_dict()``); {} when not known."""
    return Facts.from_dict(finding.get("context")).backward_at or {}


def _retain_candidates(finding: dict) -> list[list[FixIntent]]:
    """(f): the earlier backward (or ``autograd.grad``) keeps its graph when a later statement of its block
    backpropagates a loss made from the same forward, with no step in between (two losses sharing a subgraph; a
    later backward inside a helper stands at its call). Both then compute exactly the gradients the code asks for;
    a detach would drop one of them, so this comes first. Not for the same statement run twice (a loop, a function
    called twice) nor the same loss backpropagated again: that would add the same gradients twice."""
    from ..core.source_ast import line_in_block

    later = _backward_at(finding)
    freed = [w for w in finding.get("modified_at") or () if w.get("category") == "backward"]
    if finding.get("kind") != "backward_twice" or not freed or not later.get("line"):
        return []
    earlier = freed[0]
    end = line_in_block(earlier.get("file") or "", earlier.get("line") or 0, earlier.get("line") or 0,
                        later.get("function"), later["line"], earlier.get("function"))
    home = earlier.get("function") if end != later["line"] else later.get("function")  # stands at its call
    if not end or not _shares_a_forward(earlier, {**later, "line": end, "function": home}, later.get("code") or ""):
        return []
    call = _graph_call(earlier.get("code") or "")
    # gradients a later loss is made of (a gradient penalty): that backward must go through them, not only find
    # the graph, so they are made with a graph of their own (create_graph also keeps the forward's)
    made = call == "grad" and _read_before(earlier, end)
    return [[FixIntent("set_keyword", earlier["file"], earlier["line"],
                       detail={"call": call, "keyword": "create_graph" if made else "retain_graph", "value": True,
                               "add": True},
                       reason=f"the backward at line {later['line']} then finds the graph it shares with this one"
                              + (" and goes through the gradients its loss is made of" if made else ""))]]


def _read_before(statement: dict, end: int) -> bool:
    """Whether a name the statement binds (``(gx,) = torch.autograd.grad(...)``) is read before line ``end``."""
    names = assigned_names(statement.get("code") or "")
    lines = linecache.getlines(statement.get("file") or "")[statement["line"]:end]
    return any(re.search(rf"\b{re.escape(name)}\b", text) for name in names for text in lines)


def _graph_call(code: str) -> str:
    """The call of a backward statement that frees its graph: ``grad`` for ``torch.autograd.grad(...)``."""
    from ..core.source_ast import parse_code

    tree = parse_code(code.strip())
    called = {ast.unparse(n.func).split(".")[-1] for n in ast.walk(tree) if isinstance(n, ast.Call)} if tree else set()
    return "grad" if "grad" in called and "backward" not in called else "backward"


def _shares_a_forward(earlier: dict, later: dict, later_code: str) -> bool:
    """``earlier`` and ``later`` are two statements of one block, in that order, backpropagating different losses
    (``later_code`` the later backward's own line), with no step between them, the first not already retaining
    its graph."""
    file, line, end = earlier.get("file"), earlier.get("line"), later.get("line")
    if not (file and line and end and line < end and earlier.get("function") == later.get("function")
            and os.path.realpath(file) == os.path.realpath(later.get("file") or "")):
        return False
    if "retain_graph" in (earlier.get("code") or "") or any(
            ".step(" in text for text in linecache.getlines(file)[line:end - 1]):
        return False
    from ..core.source_ast import backward_receiver

    # the same loss backpropagated again (by name, or the same expression written twice): retaining its graph would
    # add its gradients twice
    first, second = (earlier.get("code") or "").strip(), later_code.strip()
    if _graph_call(first) == "grad" and first != second:
        return True  # torch.autograd.grad returns its gradients, into no .grad: nothing is added twice
    receiver = backward_receiver(first)
    return not ((receiver and receiver == backward_receiver(second)) or first == second)


def _loop_candidates(finding: dict) -> list[list[FixIntent]]:
    """(f) and (g) for one backward statement in a loop that backpropagates, each time round, through a tensor made
    once before the loop (micro-batches of one feature, epochs over a feature computed once): the first iteration's
    backward frees the graph behind it. Either that backward keeps the graph (each iteration still backpropagates
    only its own loss), or the tensor is made again at the top of the loop (alone when a step in the loop changes
    what made it). Not for a state the loop assigns (``h = cell(x, h)``): that is (d)'s carried read."""
    found = _made_before_loop(finding)
    if found is None:
        return []
    backward, name, made, loop = found
    file, line = backward["file"], backward["line"]
    repairs = [[FixIntent("set_keyword", file, line, detail={"call": _graph_call(backward.get("code") or ""),
                                                              "keyword": "retain_graph", "value": True, "add": True},
                          reason=f"`{name}` is made once, before the loop: each iteration's backward then still "
                                 f"finds the graph behind it")]]
    # a step in the loop changes the weights behind the tensor: retaining its graph would backpropagate through
    # the first iteration's values every time; made again, each iteration's gradients are its own
    if any(isinstance(n, ast.Attribute) and n.attr == "step" for n in ast.walk(loop)):
        return _made_again(file, name, made, loop)
    return repairs + _made_again(file, name, made, loop)


def _made_again(file: str, name: str, made, loop: ast.AST) -> list[list[FixIntent]]:
    """(g): the assignment that made ``name`` moved to the top of ``loop``, when it is one call on values already
    bound (``feat = enc(x)``): a nested call (``enc(torch.randn(4, 3))``, ``enc(next(batches))``) would draw new
    data each time round, another program."""
    found = _statement(file, made.line)
    value = found[0].value if found and isinstance(found[0], ast.Assign) else None
    operands = [*value.args, *(k.value for k in value.keywords)] if isinstance(value, ast.Call) else None
    body = getattr(loop, "body", None)
    if not body or operands is None or any(isinstance(n, ast.Call) for a in operands for n in ast.walk(a)):
        return []
    source = ast.get_source_segment("".join(linecache.getlines(file)), found[0])  # type: ignore[index]
    return [[FixIntent("remove_statement", file, made.line, target=made.code,
                       reason=f"`{name}` is no longer made once, before the loop"),
             FixIntent("insert_before", file, body[0].lineno, detail={"code": source},
                       reason=f"`{name}` made again each time round the loop, so that each backward has a "
                              f"graph of its own")]]


def _made_before_loop(finding: dict):
    """(the backward, the crossing tensor's name, where it was made, the innermost loop around the backward) when
    the backward that fails is the one that freed the graph (one statement, run again by its loop) and the tensor
    was made before that loop, which never assigns it; else None."""
    from ..core.source_ast import assignment_before, parse_file

    backward, name = _backward_at(finding), (finding.get("tensor") or {}).get("name")
    freed = [w for w in finding.get("modified_at") or () if w.get("category") == "backward"]
    if finding.get("kind") != "backward_twice" or not (name and freed and _same_line(freed[0], backward)):
        return None
    file, line = backward["file"], backward["line"]
    made, tree = assignment_before(file, line, name), parse_file(file)
    if made is None or tree is None or os.path.realpath(made.file) != os.path.realpath(file):
        return None
    loop = innermost(tree, line, (ast.For, ast.While))
    return (backward, name, made, loop) if loop is not None and loop.lineno > made.line and (
        name not in _assigned_in(loop)) else None


def _same_line(a: dict, b: dict) -> bool:
    """Two locations on one known line of one file."""
    return bool(a.get("file") and a.get("line")) and a.get("line") == b.get("line") and (
        os.path.realpath(a["file"]) == os.path.realpath(b.get("file") or ""))


def _assigned_in(scope: ast.AST) -> set[str]:
    """The names and attribute chains ``scope`` binds (``h``, ``self.h``)."""
    return {ast.unparse(t) for n in ast.walk(scope) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
            for t in ast.walk(target) if isinstance(t, (ast.Name, ast.Attribute))}


def _detach_candidates(finding: dict) -> list[list[FixIntent]]:
    """(d): the tensor that crosses into a freed graph detached where it is assigned, then where a call reads it."""
    from ..core.source_ast import assignment_before

    backward = _backward_at(finding)
    name = (finding.get("tensor") or {}).get("name")
    if finding.get("kind") != "backward_twice" or not name or not backward.get("file"):
        return []
    made = assignment_before(backward["file"], backward["line"], name)
    assigned = [[FixIntent("detach_assignment", made.file, made.line, target=name,
                           reason=f"`{name}` is then a value for later losses, not a path into a freed graph")]
                ] if made is not None else []
    return assigned + _carried_read_candidates(finding, made) + _detach_read_candidates(finding, name)


def _carried_read_candidates(finding: dict, made) -> list[list[FixIntent]]:
    """(d) a state carried by its own assignment (``h = cell(x, h)``, ``self.h = cell(x, self.h)``, ``avg = 0.9 *
    avg + m``), at the line that binds the crossing tensor or the one that saved it: the read on the right is the
    previous step's value, the one path into the freed graph; detached there, this step's own value keeps its
    gradient (detaching the assignment would cut it from the loss that reads it next)."""
    saved = finding.get("saved_at") or {}
    places = [(made.file, made.line)] if made is not None else []
    places += [(saved["file"], saved["line"])] if saved.get("file") and saved.get("line") else []
    repairs = []
    for file, line in dict.fromkeys(places):
        found = _statement(file, line)
        carried = carried_reads(found[0] if found else None)
        if not carried:
            continue
        spelt = ", ".join(f"`{ref}`" for ref in carried)
        reason = (f"the {spelt} read here is the previous step's: detached, it is a value, not a path into the graph "
                  f"the previous backward freed")
        many = {"targets": carried} if len(carried) > 1 else {}
        # a state that is a tuple of tensors (an LSTM's ``(h, c)`` in one attribute) is detached element by element
        repairs += [[FixIntent("detach_expression", file, line, target=carried[0], detail={**many, **each},
                               reason=reason)] for each in ({}, {"each": True})]
    return repairs


def _detach_read_candidates(finding: dict, name: str) -> list[list[FixIntent]]:
    """(d) detach the crossing tensor where a call reads it, after it was made and before the backward that fails:
    the earlier loss's read (the later loss then keeps its path) or the later loss's (a GAN's discriminator loss on
    the generator's output: the generator's backward freed that path, and the discriminator needs none). Each
    argument reading the same variable is a candidate (`outputs[j]` in `kl(outputs[i], outputs[j])` is `outputs[1]`
    at run time, which the source cannot say); verification keeps the first that makes the failure go and keeps
    the gradients the program had."""
    window = _read_window(finding, name)
    if window is None:
        return []
    file, made, end, root = window
    freed = next((f"the backward at line {w['line']}" for w in finding.get("modified_at") or ()
                  if w.get("category") == "backward" and w.get("line")), "an earlier backward")
    from ..core.source_ast import parse_file

    tree = parse_file(file)
    if tree is None:
        return []
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.lineno <= made <= (n.end_lineno or n.lineno)]
    scope = min(scopes, key=lambda n: (n.end_lineno or n.lineno) - n.lineno) if scopes else tree
    reason = "reaches the loss here as a value, not as a path into the graph " + freed + " frees"
    unique: list[list[FixIntent]] = []
    for intent in _read_intents(scope, file, made, end, root, name, reason):
        if not any(same_intent(intent, other[0]) for other in unique):  # one candidate per statement and read
            unique.append([intent])
    return unique


def _read_intents(scope: ast.AST, file: str, made: int, end: int, root: str, name: str, reason: str):
    """The detach of each read of ``root`` between the lines ``made`` (included: `hs.append(cell(x, hs[-1]))`
    reads the previous step's value where it makes this one) and ``end``: an argument of a call, or the receiver of
    a method (`h = posts.reshape(-1, 8)`) when the crossing tensor is ``root`` itself."""
    reads = sorted((n for n in ast.walk(scope) if isinstance(n, (ast.Call, ast.Attribute)) and made <= n.lineno < end),
                   key=lambda n: (n.lineno, n.col_offset))
    for node in reads:
        if isinstance(node, ast.Call):
            yield from (FixIntent("detach_argument", file, _statement_line(scope, node), target=ast.unparse(arg),
                                  detail={"call": ast.unparse(node.func)}, reason=f"`{ast.unparse(arg)}` {reason}")
                        for arg in node.args if _plain_read_of(arg, root))
        elif isinstance(node.value, ast.Name) and node.value.id == root == name and node.attr not in _METADATA:
            yield FixIntent("detach_expression", file, _statement_line(scope, node), target=root,
                            reason=f"`{root}` {reason}")


_METADATA = frozenset({"shape", "size", "dim", "ndim", "numel", "dtype", "device", "requires_grad", "grad_fn",
                       "is_leaf", "grad", "data"})


def _read_window(finding: dict, name: str):
    """(file, line made, line of the last backward, root variable) of the crossing tensor: the backward that fails
    when it is in the same file below the line made, else the one that freed its graph; None when neither is."""
    saved = finding.get("saved_at") or {}
    file, made = saved.get("file"), saved.get("line")
    root = name.split("[", 1)[0].split(".", 1)[0]
    if not (file and made and root.isidentifier()):
        return None
    backwards = [_backward_at(finding)] + [w for w in finding.get("modified_at") or () if w.get("category") == "backward"]
    ends = [b.get("line") for b in backwards
            if b.get("line") and b["line"] > made and os.path.realpath(b.get("file") or "") == os.path.realpath(file)]
    return (file, made, ends[0], root) if ends else None


def _plain_read_of(arg: ast.expr, root: str) -> bool:
    """Whether ``arg`` reads ``root`` (``outputs[1]``, ``model.h``) and calls nothing."""
    base = arg
    while isinstance(base, (ast.Subscript, ast.Attribute)):
        base = base.value
    return isinstance(base, ast.Name) and base.id == root and not any(
        isinstance(n, ast.Call) for n in ast.walk(arg))


def _statement_line(scope: ast.AST, node: ast.AST) -> int:
    """The first line of the statement that contains ``node`` (intents address statements)."""
    best = None
    for stmt in ast.walk(scope):
        if isinstance(stmt, ast.stmt) and not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                                  ast.For, ast.While, ast.If, ast.With, ast.Try)) \
                and stmt.lineno <= node.lineno and node.end_lineno <= (stmt.end_lineno or stmt.lineno):
            if best is None or stmt.lineno >= best.lineno:
                best = stmt
    return best.lineno if best is not None else node.lineno


def _step_candidates(finding: dict, write: dict) -> list[list[FixIntent]]:
    """(e): an update of weights made before a backward that needs the values it changed, moved after that backward:
    an optimizer step, or any write into a parameter (a decay, a clip or a renormalisation by hand under
    ``no_grad``). What moves is the statement of the backward's block that holds the write: the write itself, the
    ``with``/``for`` around it, or the call of the helper it is in."""
    from ..core.source_ast import bodies_with_line, line_in_block, parse_file

    backward = _backward_at(finding)
    file, line, end = write.get("file"), write.get("line"), backward.get("line")
    update = write.get("category") == "optimizer" or (finding.get("tensor") or {}).get("role") == "parameter"
    if not (update and file and line and end) or os.path.realpath(file) != os.path.realpath(backward.get("file") or ""):
        return []
    saved = (finding.get("saved_at") or {}).get("line") or 1
    line = line_in_block(file, end, min(saved, end) - 1, write.get("function"), line, backward.get("function"))
    tree = parse_file(file)
    if not line or line >= end or tree is None:
        return []
    holder = next((s for body in bodies_with_line(tree, end) for s in body
                   if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
    if holder is None:
        return []
    return [[FixIntent("move_statement", file, holder.lineno, target=write.get("code"), detail={"after_line": end},
                       reason=f"{'step' if write.get('category') == 'optimizer' else 'update the weights'} after the "
                              f"backward at line {end}, which needs the weights it updates")]]


def _fresh_forward_candidates(finding: dict, write: dict) -> list[list[FixIntent]]:
    """(e) when the step cannot move: the forward from the save up to the loss run again right after the step, so
    the later backward goes through a graph made with the updated weights (the statements between the save and
    the first backward, in the save's block). The save is the line itself or, when it is inside a module's
    forward, the call on the caller's line (`q = self.critic(obs, a)`) that the save's chain names."""
    saved = finding.get("saved_at") or {}
    for site in [saved, *(saved.get("chain") or ())]:
        found = _fresh_forward_from(site, finding, write)
        if found:
            return found
    return []


def _fresh_forward_from(saved: dict, finding: dict, write: dict) -> list[list[FixIntent]]:
    from ..core.source_ast import bodies_with_line, parse_file

    span = _step_span(saved, finding, write)
    if span is None:
        return []
    file, step, start, backward = span
    tree = parse_file(file)
    if tree is None:
        return []
    for body in bodies_with_line(tree, start):
        # only what the later backward's loss is computed from (`critic_loss` of an earlier backward is not
        # recomputed: its value, printed or logged, stays the one before the step)
        needed = _line_names(tree, backward["line"]) if os.path.realpath(backward.get("file") or file) == \
            os.path.realpath(file) else set()
        # and what the loss is made of after the step (`actor_loss = -value.mean()`: `value` is needed)
        _needed_statements([s for s in body if step < s.lineno < backward["line"]
                            and isinstance(s, (ast.Assign, ast.AnnAssign))], needed)
        kept = _needed_statements(_forward_statements(body, start, step), needed)
        text = "".join(linecache.getlines(file))
        forward = [ast.get_source_segment(text, stmt) for stmt in reversed(kept)]
        if forward and all(forward):
            return [[FixIntent("insert_after", file, step, target=None, detail={"code": "\n".join(forward)},
                               reason=f"a fresh forward after the step at line {step}: the backward at line "
                                      f"{backward['line']} then uses the weights the step wrote")]]
    return []


def _step_span(saved: dict, finding: dict, write: dict):
    """(file, step line, save line, backward) when an optimizer step sits between the save and the later backward,
    all in one file; else None. A step or backward inside a helper the save's block calls (``update(opt, loss)``
    doing zero_grad, backward and step) stands at its call there: the step at the first call after the save, the
    backward at the next call after the step's."""
    from ..core.source_ast import line_in_block

    backward = _backward_at(finding)
    file, step, start = write.get("file"), write.get("line"), saved.get("line")
    if write.get("category") != "optimizer" or not (file and step and start and backward.get("line")):
        return None
    same = {os.path.realpath(p) for p in (file, saved.get("file") or "", backward.get("file") or "")}
    if len(same) != 1:
        return None
    home = saved.get("function")
    step = line_in_block(file, start, start, write.get("function"), step, home)
    later = line_in_block(file, start, step, backward.get("function"), backward["line"], home) if step else None
    if later is None or not start < step <= later:
        return None
    return file, step, start, {**backward, "line": later}


def _forward_statements(body: list, start: int, step: int) -> list:
    """The assignments of ``body`` from line ``start`` up to the first backward, step or other statement."""
    statements = []
    for stmt in body:
        if stmt.lineno < start:
            continue
        if stmt.lineno >= step or not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or any(
                isinstance(n, ast.Attribute) and n.attr in ("backward", "step") for n in ast.walk(stmt)):
            break
        statements.append(stmt)
    return statements


def _needed_statements(statements: list, needed: set) -> list:
    """``statements`` that compute the names in ``needed`` (all of them when nothing is named), last first."""
    kept = []
    for stmt in reversed(statements):
        targets = {n.id for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
                   for n in ast.walk(t) if isinstance(n, ast.Name)}
        if not needed or targets & needed:
            kept.append(stmt)
            needed |= {n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)} if stmt.value else set()
    return kept


def general_repairs(finding: dict, sources: dict[str, str], editable: Callable[[str], bool]
                    ) -> list[list[FixIntent]]:
    """The candidates of NOTE [Repairs from the mechanism, not the rule id] for ``finding`` (a JSON finding),
    with ``sources`` the overlaid text of files already edited; only edits of files ``editable`` accepts."""
    _prime(sources)
    # the earlier backward of a backward-twice finding is listed among its writes: it wrote nothing to undo
    writes = [w for w in finding.get("modified_at") or ()
              if w.get("file") and w.get("line") and w.get("category") != "backward"]
    files = list(dict.fromkeys(
        w["file"] for w in writes + [finding.get("saved_at") or {}] + [
            _backward_at(finding)] if w.get("file") and editable(w["file"])))
    repairs: list[list[FixIntent]] = []
    receivers: list[str] = []
    for write in writes:
        if not editable(write["file"]):
            continue
        repairs += _write_repairs(finding, write, files)
        found = _statement(write["file"], write["line"])
        receivers = receivers or (_receivers(found[0]) if found else [])
    if finding.get("kind") != "backward_twice" and not any(w.get("category") == "optimizer" for w in writes):
        # a copy of the weights at the save would hide the ordering bug (backward with the pre-step weights, as
        # PyTorch < 1.5 did silently), not repair it
        repairs += _save_candidates(finding, receivers)
    repairs += [r for w in writes if editable(w["file"]) for r in _copied_items_candidates(finding, w)]
    repairs += _retain_candidates(finding) + _loop_candidates(finding) + _detach_candidates(finding)
    return _distinct_editable(repairs, editable)[:_MAX_CANDIDATES]


def _write_repairs(finding: dict, write: dict, files: list[str]) -> list[list[FixIntent]]:
    """The candidates that undo or move one write: (a), (b) and (e)."""
    written = _write_candidates(write)
    return (written + _returned_candidates(write, written) + _module_candidates(write, files)
            + _called_module_candidates(write, files)
            + _step_candidates(finding, write) + _fresh_forward_candidates(finding, write))


def _distinct_editable(repairs: list[list[FixIntent]], editable: Callable[[str], bool]) -> list[list[FixIntent]]:
    """``repairs`` that edit only editable files, each once."""
    kept: list[list[FixIntent]] = []
    for repair in repairs:
        if all(i.file and editable(i.file) for i in repair) and not any(
                len(k) == len(repair) and all(same_intent(a, b) for a, b in zip(k, repair)) for k in kept):
            kept.append(repair)
    return kept
