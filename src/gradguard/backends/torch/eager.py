"""Errors PyTorch raises eagerly (at the write, or at a second backward): add what it does not say.

PyTorch checks these in its autograd kernels before any Python hook or mode sees the op, so the guard recognises
them by message when they leave the guarded block and reads the user's frame to name the tensor. This probe only
gathers what happened (``Facts.eager_check`` and after); the rows of ``core/eager_rules.py`` say why and the fix.
"""

from __future__ import annotations

import ast
import collections
import itertools
import linecache
import re

import torch

from ..._errors import (BackwardTwiceError, GradientHazardError, InplaceModificationError, NonLeafGradError,
                        NonLeafGradTypeError, NonLeafParamError)
from ...core.diagnosis import diagnose
from ...core.facts import CrossingTensor, Facts
from ...core.findings import Finding, SaveSite, SourceLocation, TensorInfo, WriteRecord
from ...core.frames import innermost_user_entry, user_variable_names
from ...core.module_sites import path_in_user_self
from ...core.fixes import assigned_names, carried_state, statement_code
from ...core.source_ast import (statement_at, container_entries, accumulations, assignment_before, callee_of,
                                 dotted_reference, resets_between, written_expression, written_reference)
from .backward_calls import _backward_receiver, _lookup, loss_of, raised_chain, second_call_of_same_loss, user_frames_of
from .graph import Crossing, find_crossing
from .graph import _reaches_any, walk_nodes
from .backward_calls import carries_graph, forward_before_loop, innermost_loop
from .grad_read import NON_LEAF_PARAM, NONE_ERRORS, grad_read_of_non_leaf, optimizer_of_non_leaf
from .no_graph import NO_GRAPH, missing_graph, passes_true
from .graph import first_tensor_step, name_tensor, tensor_info
from ...core.internal import log_fallback

__all__ = ["enrich_eager_error"]

_LEAF = "a leaf Variable that requires grad is being used in an in-place operation"
_VIEW_OF_LEAF = "a view of a leaf Variable that requires grad is being used in an in-place operation"
_MULTI_VIEW = re.compile(r"Output \d+ of (\w+) is a view and is being modified inplace\. This view is the output "
                         r"of a function that returns multiple views")
_NO_GRAD_VIEW = "A view was created in no_grad mode and is being modified inplace with grad mode enabled"
_NO_GRAD_VIEW_BASE = "A view was created in no_grad mode and its base or another view of its base has been modified"
_FUNCTION_VIEW = re.compile(r"Output \d+ of (\w+) is a view and is being modified inplace\. This view was created "
                            r"inside a custom Function")
_BACKWARD_TWICE = "Trying to backward through the graph a second time"
_OUT_ARGUMENT = "arguments don't support automatic differentiation, but one of the arguments requires grad"
_DETACH_VIEW = "Can't detach views in-place"
_FLAG_OF_NON_LEAF = "you can only change requires_grad flags of leaf variables"


def _describe(tensor, expression: str | None) -> TensorInfo:
    if isinstance(tensor, (tuple, list)):  # `grads` of torch.autograd.grad: its first tensor, by its index
        index = next((i for i, value in enumerate(tensor) if isinstance(value, torch.Tensor)), None)
        if index is not None:
            return _describe(tensor[index], f"{expression}[{index}]" if expression else None)
    if not isinstance(tensor, torch.Tensor):
        return TensorInfo(shape=(), dtype="?", name=expression, role="tensor")
    if _stale_no_grad_view(tensor):  # autograd refuses its grad_fn (and is_leaf): nothing more to ask
        return tensor_info(tensor, expression, "view", producer=None)
    name, role = name_tensor(tensor)
    if role is None:
        role = "leaf" if tensor.is_leaf else ("view" if tensor._is_view() else "activation")
        name = expression
    elif expression and "." in expression and name and name.split(".", 1)[0] != expression.split(".", 1)[0]:
        # The heap scan names modules by the variables of the user's frames, gone once the error has left them
        # ("Embedding.weight"); the expression the user wrote ("embedding.weight") is what they will recognise.
        name = expression
    return tensor_info(tensor, name, role)


def enrich_eager_error(error: BaseException, session=None) -> GradientHazardError | None:
    """A gradguard error carrying a finding for one of PyTorch's eager in-place/backward errors, or None."""
    if isinstance(error, NONE_ERRORS) or (isinstance(error, ValueError) and NON_LEAF_PARAM in str(error)):
        try:  # NOTE [A gradient read from a tensor that is no leaf] (grad_read.py)
            return _grad_read(error, session)
        except Exception as problem:  # an enrichment failure must never replace the user's error
            log_fallback("backends.torch", "explaining an error about None after a .grad read", problem)
            return None
    if not isinstance(error, RuntimeError) or isinstance(error, GradientHazardError):
        return None
    message = str(error)
    try:
        if _BACKWARD_TWICE in message:
            return BackwardTwiceError(_backward_twice(error, session))
        if NO_GRAPH in message:
            site = _Site(error)
            return GradientHazardError(diagnose(missing_graph(site.frame, site.location, message))) if (
                site.location is not None) else None
        for matcher, kind, check in (
            (lambda m: _VIEW_OF_LEAF in m, "leaf_inplace", "view_of_leaf"),
            (lambda m: _LEAF in m, "leaf_inplace", "leaf"),
            (_MULTI_VIEW.search, "view_inplace", "multi_output_view"),
            (lambda m: _NO_GRAD_VIEW in m, "view_inplace", "no_grad_view"),
            (lambda m: _NO_GRAD_VIEW_BASE in m, "view_inplace", "no_grad_view_base"),
            (_FUNCTION_VIEW.search, "view_inplace", "custom_function_view"),
            (lambda m: _OUT_ARGUMENT in m, "out_argument", "out_argument"),
            (lambda m: _DETACH_VIEW in m, "view_inplace", "detach_view"),
            (lambda m: _FLAG_OF_NON_LEAF in m, "requires_grad_flag", "requires_grad_flag"),
        ):
            match = matcher(message)
            if match:
                site = _Site(error)
                if site.location is None:  # no line of the user's: nothing to explain it by
                    return None
                if check == "out_argument" and isinstance(site.tensor, torch.Tensor) and site.tensor.is_leaf \
                        and site.tensor.requires_grad:  # `out=` a parameter: a leaf written in place
                    kind = "leaf_inplace"
                return InplaceModificationError(_refused_write(kind, check, site, match))
    except Exception as error:  # an enrichment failure must never replace the user's error
        log_fallback("backends.torch", "explaining an eager error", error)
        return None
    return None


def _grad_read(error: BaseException, session) -> GradientHazardError | None:
    entry = innermost_user_entry(error.__traceback__)
    if entry is None:
        return None
    frame, line = entry.tb_frame, entry.tb_lineno
    filename = frame.f_code.co_filename
    location = SourceLocation(filename, line, frame.f_code.co_name, linecache.getline(filename, line).strip())
    if isinstance(error, ValueError):
        finding = optimizer_of_non_leaf(error, frame, location)
        return NonLeafParamError(diagnose(finding)) if finding is not None else None
    finding = grad_read_of_non_leaf(error, frame, location, getattr(session, "node_sites", None) or {})
    if finding is None:
        return None
    # the error the user's line raised stays what it was to `except` handlers
    return (NonLeafGradError if isinstance(error, AttributeError) else NonLeafGradTypeError)(diagnose(finding))


class _Site:
    """Where the eager error surfaced in user code: the line, the written expression, its value."""

    def __init__(self, error: BaseException):
        self.error = error
        self.location = self.expression = self.tensor = self.frame = self.via = None
        self.code = ""
        entry = innermost_user_entry(error.__traceback__)
        if entry is None:
            return
        frame = entry.tb_frame
        filename, line = frame.f_code.co_filename, entry.tb_lineno
        self.frame = frame
        self.via = _writing_module(entry)
        self.code = linecache.getline(filename, line).strip()
        self.location = SourceLocation(filename, line, frame.f_code.co_name, self.code)
        self.expression = _written(filename, line, frame) or _view_named_by_error(error, filename, line, frame)
        self.tensor = _lookup(self.expression, frame) if self.expression else None
        if self.tensor is None and self.via:  # written inside the module: the tensor it was called on
            self.tensor = _module_input(entry)
        self.info = _describe(self.tensor, self.expression)
        self.made = None
        if self.expression and self.info.role not in ("parameter", "buffer"):
            # `hx[idx]` was made where the container `hx` was: the reference up to its first index
            bound = self.expression.split("[", 1)[0]
            made = assignment_before(filename, line, bound)
            # assignment_before also matches `w.grad = ...` for `w`: only a statement binding the expression counts
            if made is not None and bound in assigned_names(statement_code(made)):
                self.made = made


def _writing_module(entry) -> str | None:
    """``net.1 (ReLU(inplace=True))``: the in-place module whose forward, called from the user's line, made the write
    PyTorch refused (the write itself is in torch's code). The path runs from the module the line called, by the
    name that holds it, so the repair search finds where that instance was built (NOTE [Resolving the writing
    instance to its construction])."""
    modules = _modules_below(entry)
    writer = next((m for m in reversed(modules) if getattr(m, "inplace", None) is True), None)
    if writer is None:
        return None
    kind = f"{type(writer).__name__}(inplace=True)"
    root = modules[0]  # the traceback's frames: the stack the user's frames were on is gone by now
    head = user_variable_names({id(root)}, start=entry.tb_frame).get(id(root)) or path_in_user_self(
        root, start=entry.tb_frame)
    if head is None:
        return kind
    path = next((name for name, m in root.named_modules() if m is writer and name), "")
    return f"{head}{'.' + path if path else ''} ({kind})"


def _module_input(entry) -> torch.Tensor | None:
    """The tensor the innermost in-place module below the user's frame was called on (what it wrote): the first
    argument of its ``forward``."""
    found = None
    tb = entry.tb_next
    while tb is not None:
        code, owner = tb.tb_frame.f_code, tb.tb_frame.f_locals.get("self")
        if code.co_name == "forward" and getattr(owner, "inplace", None) is True and code.co_argcount > 1:
            value = tb.tb_frame.f_locals.get(code.co_varnames[1])
            found = value if isinstance(value, torch.Tensor) else found
        tb = tb.tb_next
    return found


def _modules_below(entry) -> list[torch.nn.Module]:
    """The modules whose code runs below the user's frame ``entry``, outermost first."""
    modules: list[torch.nn.Module] = []
    tb = entry.tb_next
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module) and all(owner is not m for m in modules):
            modules.append(owner)
        tb = tb.tb_next
    return modules


def _written(filename: str, line: int, frame) -> str | None:
    """The reference written on the line, a ``getattr(module, name)`` receiver spelt as ``module.weight``."""
    expression = written_expression(filename, line, dynamic=True)
    if expression is not None and "getattr(" in expression:
        return dotted_reference(expression, collections.ChainMap(frame.f_locals, frame.f_globals))
    # `hx[idx].squeeze_(0)` on a tuple `hx` writes `hx[idx]`: the first step of the reference that is a tensor
    reference = written_reference(filename, line)
    found = first_tensor_step(reference, frame) if reference is not None and reference != expression else None
    return found[0] if found is not None else expression


def _view_named_by_error(error: BaseException, filename: str, line: int, frame) -> str | None:
    """The variable on the line whose tensor is the view PyTorch's message names: "Output 1 of SplitWithSizesBackward0
    is a view ..." for a write inside a call (``self.relu(x)``), or the view made under no_grad whose base was written
    since, which the line reads; None unless exactly one matches."""
    match = _MULTI_VIEW.search(str(error))
    stmt = statement_at(filename, line) if match or _NO_GRAD_VIEW_BASE in str(error) else None
    if stmt is None:
        return None
    found = []
    for name in dict.fromkeys(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)):
        value = frame.f_locals.get(name, frame.f_globals.get(name))
        if isinstance(value, torch.Tensor) and (_grad_fn_named(value, match.group(1)) if match else
                                                _stale_no_grad_view(value)):
            found.append(name)
    return found[0] if len(found) == 1 else None


def _grad_fn_named(tensor: torch.Tensor, op: str) -> bool:
    return tensor.grad_fn is not None and tensor.grad_fn.name() in (op, op + "Backward0")


def _stale_no_grad_view(tensor: torch.Tensor) -> bool:
    """A view made under no_grad whose base was written with grad mode on: autograd refuses its grad_fn."""
    if not tensor._is_view():
        return False
    try:
        tensor.grad_fn
    except RuntimeError as refused:
        return _NO_GRAD_VIEW_BASE in str(refused)
    return False


def _refused_write(kind: str, check: str, site: _Site, match) -> Finding:
    """An in-place write PyTorch refused at ``site``: what happened, for the rows of core/eager_rules.py."""
    written = site.expression
    owner = (_lookup(written.rsplit(".", 1)[0], site.frame)
             if written and "." in written and site.info.role == "parameter" else None)
    facts = Facts(display=[], torch_message=str(site.error), eager_check=check, written=written, made_at=site.made,
                  view_op=match.group(1) if isinstance(match, re.Match) else None,
                  owner_module=next(c.__name__ for c in type(owner).__mro__ if c.__module__.startswith("torch.nn"))
                  if isinstance(owner, torch.nn.Module) else None)  # the torch.nn class: "Embedding" for a subclass
    return diagnose(Finding(kind=kind, tensor=site.info, facts=facts,
                            modified_at=[WriteRecord(op="in-place write", location=site.location, via=site.via,
                                                     category="activation" if site.via else "other")]))


def _holds_sequence(crossing: Crossing, frame) -> bool:
    """Whether what the crossing's statement binds holds a tuple or list of tensors (an LSTM's (h, c)): the name
    itself, or the container an element of it comes from (`self.hidden` of `self.hidden[0]`)."""
    if frame is None:
        return False
    name = crossing.name  # and each container on the way (`state['s0']` and `state` of `state['s0'][0]`)
    names = [name] + [name[:i] for i in range(len(name) - 1, 0, -1) if name[i] == "["]
    return any(isinstance(_lookup(name, frame), (tuple, list)) for name in names)


def _kept_with(name: str, frame) -> tuple[str, ...]:
    """NOTE [Buffers filled in step] (core/eager_rules.py): for a crossing that is a list or deque (or an item of
    one) that the file fills by `append`/`appendleft`/`insert`, that container, then the containers the file fills
    that are held beside it (attributes of the same object, or variables of the frame) with as many items, each
    spelt as ``frame`` reaches it; () otherwise."""
    value = _lookup(name.split("[", 1)[0], frame) if frame is not None else None
    if not isinstance(value, (list, collections.deque)) or not value:
        return ()
    filled: dict[int, list[str]] = {}  # id of each container an entry statement of the file fills -> its spellings
    for receiver in dict.fromkeys(callee.rsplit(".", 1)[0] for _l, _i, callee in container_entries(
            frame.f_code.co_filename, None)):
        found = _lookup(receiver, frame)
        if isinstance(found, (list, collections.deque)):
            filled.setdefault(id(found), []).append(receiver)
    spellings = filled.get(id(value))
    if not spellings:
        return ()
    spelt = max(spellings, key=lambda s: "." in s)  # an attribute (`model.saved_actions`) shows what holds it
    owner_name = spelt.rpartition(".")[0]
    owner = _lookup(owner_name, frame) if owner_name else None
    members = ([(f"{owner_name}.{k}", v) for k, v in vars(owner).items()] if hasattr(owner, "__dict__")
               else list(frame.f_locals.items()) if not owner_name else [])
    beside = sorted(n for n, other in members if other is not value and id(other) in filled
                    and isinstance(other, (list, collections.deque)) and len(other) == len(value))
    return (spelt, *beside)


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
    """(node, forward line, the user's call around it) of the node of the failing graph an earlier backward pass
    freed, nearest to where the graphs meet; None when no earlier pass under this guard unpacked it.
    NOTE [Where a freed graph was made] (session.py)."""
    sites = session.node_sites
    if not sites or site.frame is None:
        return None
    loss = loss_of(site.frame, site.code)[1]
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        return None
    # ``current``, ``latest``: the pass count and the latest backward line when the error arrived. Nodes the
    # failing backward ran carry the latest pass, unless it unpacked nothing (its first saved tensor was already
    # freed): then the latest backward line is not the failing one. In a loop both are one line: only older count.
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


def _crossing_tensor(site: _Site, earlier: SourceLocation | None) -> Crossing | None:
    """The user variable whose freed graph the failing loss depends on, where it was made, and the call that fed
    it into the earlier backward."""
    if site.frame is None or site.location is None:
        return None
    receiver, loss = loss_of(site.frame, site.code)
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        return None
    # the nodes whose saved tensors are gone (freed by an earlier backward, or by the failing one on its way there)
    freed = {node for node in walk_nodes([loss.grad_fn], 5000) if _freed(node)}
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
    return Crossing(name, value, None, made, None, used=used, callee=callee)  # no holder: found by name


def _crossing_candidates(site: _Site, receiver: str | None, freed: set, earlier: SourceLocation | None):
    """(line made, name, where made, tensor) for each variable in the failing frame whose graph reaches what an
    earlier backward freed, made before that backward ran."""
    scope = {**site.frame.f_globals, **site.frame.f_locals}
    filename, line = site.location.file, site.location.line
    # When the earlier backward is this statement in an earlier iteration, a tensor assigned unconditionally in the
    # loop body was recomputed since; one assigned under an `if` or outside the loop may still hold the old graph.
    every_iteration = _assigned_every_iteration(filename, line) if earlier is not None and (
        earlier.file, earlier.line) == (filename, line) else frozenset()
    for name, value, binding in _graph_tensors(scope):
        # module state (`self.hidden`), replaced by every forward: its new graph runs back into the freed one
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
    """NOTE [Finding the crossing by the graph] (graph.py), from the failing backward's user frames outwards."""
    frames = list(itertools.islice(user_frames_of(site.frame), 32))
    # The innermost user frame may be a custom Function's backward reading its freed ctx.saved_tensors: the
    # loss is the receiver in the first frame, outwards, whose line calls .backward().
    for index, frame in enumerate(frames):
        loss = loss_of(frame)[1]
        if isinstance(loss, torch.Tensor):
            return find_crossing(loss, frames[index:], list(getattr(session, "backward_calls", ())),
                                 getattr(session, "node_sites", None) or {})
    return None


def _graph_tensors(scope: dict):
    """(name, tensor, how its assignment is written) for every graph-carrying tensor in ``scope``: variables, and
    tensor attributes of modules (``model.c``, assigned as ``self.c``)."""
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
    """Lines of the statements that run in every iteration of the innermost loop around ``line``: its body's and
    its ``with`` blocks', not branches or nested loops."""
    loop = innermost_loop(filename, line, (ast.For, ast.While, ast.AsyncFor), lambda loop: loop.lineno + 1)
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
    for number in range(start, stop):
        code = linecache.getline(filename, number).strip()
        callee = callee_of(code, argument=name)
        if callee is not None:
            return SourceLocation(filename, number, "", code), callee
    return None, None


def _accumulated_without_reset(site: _Site, earlier):
    """(name, first accumulation, accumulation after the earlier backward, its loop, None) when the failing loss
    accumulates across the earlier backward without a reset (corpus 061: SAM's two passes), a running sum's
    (:func:`_running_sum`, with the term it adds) when the same backward ran a step earlier, else None."""
    if site.frame is None or site.location is None or earlier is None or earlier.file != site.location.file:
        return None
    receiver = _backward_receiver(site.code)
    if receiver is None or "." in receiver:
        return None
    statements = accumulations(site.location.file, receiver)
    before = [pair for pair in statements if pair[0].lineno < earlier.line]
    after = [pair for pair in statements if earlier.line < pair[0].lineno < site.location.line]
    if before and not after and earlier.line == site.location.line:
        return _running_sum(receiver, before[-1], site.location.line)
    if not before or not after:
        return None
    again, loop = after[0]
    if resets_between(site.location.file, receiver, earlier.line, again.lineno):
        return None
    return receiver, before[0][0], again, loop, None


def _running_sum(receiver: str, accumulation, line: int):
    """The same backward a step earlier: the loop around ``line`` backpropagates its running sum in every step
    (``(receiver, statement, statement, loop, the term one step adds)``), else None."""
    added, loop = accumulation
    term = _added_term(added)
    inside = loop is not None and loop.lineno < line <= (loop.end_lineno or loop.lineno)
    return (receiver, added, added, loop, term) if term is not None and inside else None


def _added_term(statement) -> str | None:
    """``loss`` of ``total += loss`` or ``total = total + loss``: what one step adds to the running sum."""
    if isinstance(statement, ast.AugAssign) and isinstance(statement.op, ast.Add):
        return ast.unparse(statement.value)
    value = getattr(statement, "value", None)
    return ast.unparse(value.right) if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add) else None


def _keeps_graph(site: SourceLocation) -> bool:
    """Whether the backward at ``site`` is called with retain_graph=True or create_graph=True: it freed nothing."""
    statement = statement_at(site.file, site.line)
    return statement is not None and any(
        passes_true(call, "retain_graph") or passes_true(call, "create_graph")
        for call in ast.walk(statement) if isinstance(call, ast.Call))


class _TwiceCase:
    """What the probe gathers about a backward through a freed graph (the rows of core/eager_rules.py explain it)."""

    def __init__(self, error, site: _Site, session):
        self.error, self.site, self.session = error, site, session
        self.location = site.location
        self.saved_at = SaveSite()  # no autograd node saved anything here; only some explanations name a line
        self.carried = self._carried()
        self.earlier = self._earlier(list(session.backward_sites) if session is not None else [])
        self.loss = self.receiver = None
        self.same_loss = self._same_loss()
        self.mechanism = self._mechanism()
        if self.mechanism is not None and self.mechanism.freed_by is not None:
            self.earlier = self.mechanism.freed_by
        self.hoisted = self._hoisted()
        self.crossing = self._crossing()
        self.accumulated = None if (self.same_loss is not None or self.hoisted is not None
                                    or self.crossing is not None) else _accumulated_without_reset(site, self.earlier)
        if self.accumulated is not None and self.accumulated[4] is not None:
            self.carried = []  # the carried state is the running sum backpropagated itself: the sum's row explains it
        elif self.carried:
            self.accumulated = None

    def _carried(self) -> list:
        site = self.site
        if site.frame is None:
            return []
        scope = {**site.frame.f_globals, **site.frame.f_locals}
        return [c for c in carried_state(self.location) if carries_graph(scope.get(c.name))]

    def _earlier(self, sites: list):
        # In a loop the earlier backward is the same line (carried state); otherwise the failing backward is
        # recorded too (it unpacked its new graph first): the earlier one is the latest on another line.
        sites = [s for s in sites if not _keeps_graph(s)] or sites
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
            self.receiver, self.loss = loss_of(site.frame, site.code)
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

    def _crossing(self) -> Crossing | None:
        mechanism, earlier, location = self.mechanism, self.earlier, self.location
        if mechanism is not None and mechanism.tensor is not None and self.hoisted is None:
            crossing, made = mechanism, mechanism.made
            if (mechanism.holder == "variable" and made is not None and earlier is not None and location is not None
                    and made.file == earlier.file == location.file):
                crossing.used, crossing.callee = _first_call_with(made.file, made.line + 1,
                                                                  min(earlier.line, location.line), mechanism.name)
            return crossing
        if self.carried or self.hoisted is not None or self.same_loss is not None:
            return None
        # The search by name decides where the graph's finds nothing: a `with gradguard.guard():` in the failing
        # backward's frame (its f_lineno is the `with` line; the name search reads the traceback's), and a module
        # keeping a tuple of states (`self.hidden = (h, c)`, corpus 015: _module_of raises on `model.hidden[0]`).
        try:
            return _crossing_tensor(self.site, earlier)
        except RuntimeError:  # reading the graph failed: the plain diagnosis below still stands
            return None


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


def _twice_tensor(case: _TwiceCase) -> TensorInfo:
    """The tensor of the first explanation that fits (the one that knows most first); those that know where the
    freed graph was made set ``case.saved_at``."""
    site, location = case.site, case.location
    if case.carried:
        state = case.carried[0]
        value = site.frame.f_locals.get(state.name, site.frame.f_globals.get(state.name))
        is_tuple = isinstance(value, (tuple, list))
        first = value[0] if is_tuple else value
        return tensor_info(first, f"{state.name}[0]" if is_tuple else state.name, "carried state")
    if case.same_loss is not None:
        return _describe(case.loss, case.receiver)  # both read where same_loss was found
    if case.hoisted is not None:
        name = case.hoisted["name"]
        case.saved_at = SaveSite(location=SourceLocation(location.file, case.hoisted["first"], location.function))
        return _describe(_lookup(name, site.frame), name)
    if case.crossing is not None:
        return tensor_info(case.crossing.tensor, case.crossing.name, "activation")
    receiver = _backward_receiver(site.code)
    value = _lookup(receiver, site.frame) if receiver and site.frame is not None else None
    if case.accumulated is not None:
        case.saved_at = SaveSite(location=SourceLocation(location.file, case.accumulated[1].lineno,
                                                         location.function))  # code read on first use
        return _describe(value, receiver)
    return (_describe(value, receiver) if isinstance(value, torch.Tensor)
            else TensorInfo(shape=(), dtype="unknown dtype", name=receiver, role="graph"))


def _backward_twice(error, session) -> Finding:
    site = _Site(error)
    # read before anything below walks the graph: reading a live node's saved tensor runs the unpack hook
    passes = (session.ledger.backward_passes, session.backward_sites[-1] if session.backward_sites else None) if (
        session is not None) else None
    case = _TwiceCase(error, site, session)
    tensor = _twice_tensor(case)
    saved_at = _twice_saved_at(case, passes)
    # The earlier backward is what made this graph unusable: the "write" of this kind, in the JSON too.
    freed_by = case.same_loss[0] if case.same_loss is not None else case.earlier
    writes = [WriteRecord(op="backward", location=freed_by, via="the earlier backward, which freed the saved tensors",
                          category="backward")] if freed_by is not None else []
    carried, crossing, accumulated = (case.carried[0] if case.carried else None), case.crossing, case.accumulated
    carried_value = _lookup(carried.name, site.frame) if carried is not None else None
    facts = Facts(
        display=[], torch_message=str(error), eager_check="backward_twice", receiver=_backward_receiver(site.code),
        carried=carried, carried_tensors=len(carried_value) if isinstance(carried_value, (tuple, list)) else None,
        same_loss=list(case.same_loss) if case.same_loss is not None else None, forward_before_loop=case.hoisted,
        crossing=CrossingTensor(
            crossing.name, crossing.made, crossing.used, crossing.callee, crossing.holder, crossing.binding,
            _holds_sequence(crossing, site.frame),
            crossing.read, _kept_with(crossing.name, site.frame),
        ) if crossing is not None else None,
        accumulation={"first": accumulated[1].lineno, "again": accumulated[2].lineno,
                      "reset_before": (accumulated[3] or accumulated[2]).lineno,
                      **({"term": accumulated[4]} if accumulated[4] else {})} if accumulated is not None else None)
    facts.backward_at = site.location.to_dict() if site.location else None  # after the message, as JSON always had it
    return diagnose(Finding(kind="backward_twice", tensor=tensor, saved_at=saved_at, modified_at=writes, facts=facts))
