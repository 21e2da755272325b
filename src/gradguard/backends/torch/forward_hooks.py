"""Module forward hooks for the silent classes the sentinel cannot see through saved tensors (no write log):
a module writing its caller's input in place, and a forward changing its own parameter through ``.data`` before
using it; and the write log's checks of both classes.

# NOTE [Silent classes without the write log]
# Both classes change a tensor without a version bump autograd would check later (the caller's input is read
# by an add, which saves nothing; a ``.data`` write has its own version counter), so only forensic mode's write
# log used to see them. Two global module hooks see them in every mode: before a forward, the versions of the
# tensors passed in (and, for a forward whose source writes ``.data`` from the old value, a copy of the
# module's own parameters); after it, a changed version means the module wrote its caller's tensor, and the
# caller's source says whether it reads that tensor again (core/later_reads.py); a changed parameter that the
# output's graph uses means the normalisation is invisible to autograd. The price is paid per module call:
# global hooks take torch's module call off its fast path, and each call costs the two hooks (measured in
# benchmarks/bench_forward_hooks.py). Forensic mode keeps its write-log checks and installs none of this.

A module writing into its caller's tensor, which the caller then reads again.

``nn.ReLU(inplace=True)`` as the first layer of a residual branch rectifies the caller's ``x`` itself:
``x + self.branch(x)`` then adds the rectified ``x``. An add saves nothing, so PyTorch raises nothing and the
forward silently computes something else (rosinality/vq-vae-2-pytorch#60, iduta/iresnet#2).

Two halves, both in the write log's dispatch mode (forensic mode):

* at an in-place write, the frames outward from it: past a module call (``Module._call_impl``), a user frame
  holding the written tensor in a local variable is a caller whose tensor a module wrote. Its source says where
  it reads that variable again (core/later_reads.py); those reads are kept, with weak references only.
* at every later op while such reads are pending: an op consuming the tensor while the caller's frame runs one
  of those reads is the read. It raises there, before the wrong value spreads.

# NOTE [Cost of the module-input check]
# Only in-place writes with grad mode on walk the frames (a ReLU(inplace=True) per block, not the optimizer's
# writes, which run under no_grad), reading the locals of user frames above a module call. Pending reads cost
# every op one truthiness test; they exist only where the source reads a written input again, which a correct
# program rarely does (``out = self.relu(out)`` rebinds the name and leaves nothing pending).

A module's forward changing its own parameter through ``.data`` before using it.

Checked when the forward saves the parameter for backward (write log / forensic mode): the saving frame is a
module's ``forward``; its source is scanned once for ``.data`` writes that depend on the old value
(core/data_statements.py), and a write before the saving line whose target is the saved parameter is the
finding. The normalisation it performs is invisible to autograd: the gradient is computed as if the stored
weight were used, then applied to the normalised one.
"""

from __future__ import annotations

import ast
import linecache
import re
import sys
import traceback
import warnings
import weakref
from dataclasses import dataclass

import torch

from ...core.data_statements import data_statements
from ...core.findings import Finding, SourceLocation, WriteRecord
from ...core.frames import is_gradguard_file, is_plumbing, location_of, user_frames
from ...core.internal import log_fallback
from ...core.later_reads import Span, later_reads, position_of, span_contains
from ...core.patching import SharedPatches
from ...core.source_ast import evaluate_reference, function_node
from .backward_calls import _is_user
from .graph import tensor_finding, walk_nodes

__all__ = ["ForwardHooks", "PendingRead", "MAX_PENDING", "written_input", "read_of", "finding", "caller_reads_again",
           "parameter_of", "data_write_before_save", "parameters_before", "changed_in_forward"]

_MAX_FRAMES = 64
MAX_PENDING = 64


_CALL_CODES = frozenset(getattr(getattr(torch.nn.Module, name, None), "__code__", None)
                        for name in ("_call_impl", "_wrapped_call_impl")) - {None}


@dataclass
class PendingRead:
    """A caller's variable a module wrote into, and where the caller's source reads it again."""

    tensor: "weakref.ref[torch.Tensor]"
    frame_id: int  # never the frame itself: a frame keeps every local (and tensor) of the caller alive
    code: object
    names: tuple[str, ...]
    reads: tuple[tuple[str, Span], ...]
    write: WriteRecord  # location: the caller's call of the module; via: "self.conv.0 (ReLU(inplace=True))"
    producer: str | None  # the tensor's grad_fn before the write
    rank: tuple[int, int] | None  # the writer is the k-th of n modules of its class with inplace=True in the call
    inside: WriteRecord | None = None  # the write's own line, when the module's forward is the user's code


def _module_text(outer, inner, called: str | None) -> str:
    """``self.conv.0 (ReLU(inplace=True))``: the module the caller called, the path to the one that wrote."""
    path = ""
    if outer is not None and inner is not None and outer is not inner:
        path = next((name for name, m in outer.named_modules() if m is inner), "")
    head = called or (type(outer).__name__ if outer is not None else "a module")
    head = f"{head}.{path}" if path else head
    if inner is None:
        return head
    kind = type(inner).__name__
    return f"{head} ({kind}(inplace=True))" if getattr(inner, "inplace", False) is True else f"{head} ({kind})"


def _rank(outer, inner) -> tuple[int, int] | None:
    """(k, n): ``inner`` is the k-th of the n modules of its class constructed with inplace=True under ``outer``
    (module order is construction order, which names the line to edit when the file has n such calls)."""
    if outer is None or getattr(inner, "inplace", None) is not True:
        return None
    same = [m for m in outer.modules() if type(m) is type(inner) and getattr(m, "inplace", None) is True]
    return next(((k, len(same)) for k, m in enumerate(same) if m is inner), None)


def _called_text(frame, span: Span) -> str | None:
    """The callee as written at the caller's call (``self.conv`` in ``out = self.conv(input)``)."""
    if span[0] != span[1]:
        return None
    text = linecache.getline(frame.f_code.co_filename, span[0])[span[2]:span[3]]
    return text.split("(", 1)[0].strip() or None


def _binds(frame, target) -> tuple[str, ...]:
    return tuple(n for n, v in frame.f_locals.items() if v is target)


def _outward(frame):
    """``frame`` and the frames around it, innermost first, at most _MAX_FRAMES of them."""
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return
        yield frame
        frame = frame.f_back


def written_input(func, target: torch.Tensor, skip: int = 2) -> PendingRead | None:
    """The caller reads a module wrote into (see the module docstring), or None. ``skip``: frames of gradguard's
    own between this call and the op.

    # NOTE [Where the walk for a module's caller stops]
    # The op's direct Python caller must hold the written tensor (``F.relu`` holds ``input``; the temporaries an
    # op like lstm_cell writes inside C++ are held by no frame: nothing more to look at). Outward, a tensor a
    # frame holds came into each inner frame as an argument, so the first user frame past a module call that
    # does not hold it means no frame further out does either (it was made there, as a temporary).
    """
    if not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:
        return None
    try:
        frame = sys._getframe(skip)
    except ValueError:
        return None
    while frame is not None and (is_gradguard_file(frame.f_code.co_filename)
                                 or is_plumbing(frame.f_code.co_filename)):
        frame = frame.f_back  # gradguard's mode, and torch's Dynamo-disable wrapper around it
    if frame is None or not _binds(frame, target):
        return None
    writing = frame if _is_user(frame.f_code.co_filename) else None  # `token += pos` in the user's own forward
    inner = outer = None
    for frame in _outward(frame):
        code = frame.f_code
        if code in _CALL_CODES:
            module = frame.f_locals.get("self")
            if isinstance(module, torch.nn.Module):
                inner = inner if inner is not None else module
                outer = module
        elif outer is not None and _is_user(code.co_filename):
            names = _binds(frame, target)
            if not names:
                return None
            span = position_of(frame)  # the caller's reads of ``names`` after the module call
            reads = later_reads(code, span, frozenset(names)) if span is not None else None
            if reads:
                return _pending(target, frame, span, names, reads, func.name().replace("::", "."), (outer, inner),
                                writing)
    return None


def _pending(target: torch.Tensor, frame, span: Span, names: tuple, reads: tuple, op: str, modules: tuple,
             writing=None) -> PendingRead:
    """``modules``: the outermost and innermost module called; ``writing``: the user frame that wrote, if any."""
    outer, inner = modules
    inside = None
    if writing is not None and writing is not frame:
        inside = WriteRecord(op=op, location=location_of(writing), category="module_input",
                             via=f"inside {type(inner).__name__}.{writing.f_code.co_name}")
    via = _module_text(outer, inner, _called_text(frame, span))
    write = WriteRecord(op=op, location=location_of(frame), via=via, category="module_input")
    producer = target.grad_fn.name() if target.grad_fn is not None else None
    return PendingRead(weakref.ref(target), id(frame), frame.f_code, names, reads, write, producer,
                       _rank(outer, inner), inside)


def read_of(pending: PendingRead, skip: int = 2) -> SourceLocation | None:
    """Where the caller reads ``pending``'s tensor now, if the op being dispatched is that read; else None."""
    try:
        frame = sys._getframe(skip)
    except ValueError:
        return None
    for frame in _outward(frame):
        if id(frame) == pending.frame_id and frame.f_code is pending.code:
            span = position_of(frame)
            reads = span is not None and any(span_contains(span, read) for _name, read in pending.reads)
            return location_of(frame) if reads else None
    return None


def finding(pending: PendingRead, t: torch.Tensor, read: SourceLocation) -> Finding:
    name, module, call = pending.names[0], pending.write.via, pending.write.location
    display = [("write", f"{module} wrote into `{name}` in place, called at {call.short}"),
               ("read", f"`{name}` read again at {read.short}")]
    return tensor_finding("module_input_write", t, name, "activation" if pending.producer else "leaf",
                          [pending.write] + ([pending.inside] if pending.inside is not None else []), display,
                          pending.producer, name=name, module=module, call=call.to_dict(), read=read.to_dict(),
                          module_rank=list(pending.rank) if pending.rank else None)


def caller_reads_again(module: torch.nn.Module, target: torch.Tensor, inner=None) -> Finding | None:
    """Seen after ``module``'s forward changed the version of ``target``, one of its inputs (the global forward
    hook, NOTE [Silent classes without the write log]): the finding when the frame that
    called the module is the user's and its source reads ``target`` again after the call; None otherwise (a
    library's caller, a Sequential: the hook of the module around it asks again). ``inner``: the module inside
    that wrote, seen by an inner call's hook."""
    frame = next((f for f in _outward(sys._getframe(1))  # up to this module's call
                  if f.f_code in _CALL_CODES and f.f_locals.get("self") is module), None)
    if frame is None:
        return None
    frame = frame.f_back
    while frame is not None and (frame.f_code in _CALL_CODES or is_plumbing(frame.f_code.co_filename)):
        frame = frame.f_back
    if frame is None or not _is_user(frame.f_code.co_filename):
        return None
    names = _binds(frame, target)
    span = position_of(frame) if names else None
    if span is None:
        return None
    reads = _definite_reads(frame.f_code, span, names)
    if not reads:
        return None
    inner = inner if inner is not None else module
    pending = _pending(target, frame, span, names, reads, "in-place write of the module's input", (module, inner))
    call, line = pending.write.location, reads[0][1][0]
    read = SourceLocation(call.file, line, call.function, linecache.getline(call.file, line).strip())
    return finding(pending, target, read)


def _definite_reads(code, span: Span, names: tuple) -> tuple:
    """The reads of ``names`` that follow the call at ``span`` whatever branches run: loads in the calling
    statement itself (a left operand), then in the statements after it, in its block and the blocks around it,
    up to a store that rebinds the name. A load inside a later ``if``/loop/``try`` may not run and is skipped (the
    sentinel reports before the read happens, so it reports only reads that will); a store inside one may not run
    either, so it does not end the search. ``self.relu(h)`` as a statement of its own is called for its effect.

    # NOTE [A write of the caller's input, reported before the read]
    # The write log reports at the read itself (an op consuming the tensor); the sentinel has no op stream, so
    # its forward hook decides from the source when the forward returns: only reads every path reaches count.
    """
    function = function_node(code.co_filename, code.co_firstlineno, code.co_name)
    if function is None:
        return ()
    chain = _block_chain(function, span[0])
    if not chain:
        return ()
    block, index = chain[-1]
    calling = block[index]
    if isinstance(calling, ast.Expr):
        return ()
    found: list = [r for r in later_reads(code, span, frozenset(names))  # in the calling statement itself
                   if calling.lineno <= r[1][0] <= (calling.end_lineno or calling.lineno)]
    stored = {n.id for n in ast.walk(calling) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    pending = [n for n in names if n not in stored]
    for block, index in reversed(chain):
        pending = _reads_in(block[index + 1:], pending, found)
        if not pending:
            return tuple(found)
        if isinstance(block, list) and any(isinstance(s, (ast.Return, ast.Raise)) for s in block[index + 1:]):
            break  # the block returns: the statements after its compound statement do not run
    return tuple(found)


def _reads_in(statements: list, pending: list, found: list) -> list:
    """Add to ``found`` the first load of each name in ``pending`` among the statements that surely run; the
    names still pending (neither read nor rebound)."""
    for statement in statements:
        if not pending:
            break
        for simple in _surely_run(statement):
            loads = {n.id for n in ast.walk(simple) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            for name in [n for n in pending if n in loads]:
                found.append((name, (simple.lineno, simple.end_lineno or simple.lineno, simple.col_offset,
                                     simple.end_col_offset or 0)))
                pending.remove(name)
            stores = {n.id for n in ast.walk(simple) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            pending = [n for n in pending if n not in stores]
    return pending


def _surely_run(statement) -> list:
    """The simple statements of ``statement`` that run whenever it does: a ``with`` block's body, none of a
    branch, loop, ``try`` or definition."""
    if isinstance(statement, (ast.With, ast.AsyncWith)):
        return list(statement.body)
    if isinstance(statement, (ast.If, ast.For, ast.While, ast.Try, ast.AsyncFor, ast.FunctionDef,
                              ast.AsyncFunctionDef, ast.ClassDef)) or type(statement).__name__ in ("Match", "TryStar"):
        return []
    return [statement]


def _block_chain(function, line: int) -> list:
    """(block, index) from the function's body inwards to the innermost statement spanning ``line``."""
    chain, block = [], function.body
    while True:
        index = next((i for i, s in enumerate(block) if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        if index is None:
            return chain
        chain.append((block, index))
        statement = block[index]
        inner = next((getattr(statement, field) for field in ("body", "orelse", "finalbody", "handlers")
                      if any(hasattr(candidate, "lineno") and candidate.lineno <= line <= (candidate.end_lineno or 0)
                             for candidate in getattr(statement, field, None) or [])), None)
        if inner is None:
            return chain
        if inner and type(inner[0]).__name__ == "ExceptHandler":
            handler = next(h for h in inner if h.lineno <= line <= (h.end_lineno or 0))
            inner = handler.body
        block = inner


# -- a forward changing its own parameter through .data ----------------------------------------------------------------
def parameter_of(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` or its base when that is a leaf requiring grad (linear saves ``weight.t()``), else None."""
    if t.is_leaf:
        return t if t.requires_grad else None
    base = t._base
    return base if base is not None and base.is_leaf and base.requires_grad else None


def data_write_before_save(parameter: torch.Tensor, skip: int = 2) -> Finding | None:
    try:
        frame = next(user_frames(sys._getframe(skip)), None)
    except ValueError:
        return None
    if frame is None or frame.f_code.co_name != "forward":
        return None
    code = frame.f_code
    statements = data_statements(code.co_filename, code.co_firstlineno, code.co_name)
    if not statements:
        return None
    scope = frame.f_locals
    if not isinstance(scope.get("self"), torch.nn.Module):
        return None
    for target, line, text in statements:
        if line < frame.f_lineno and evaluate_reference(target, scope) is parameter:
            return _finding(parameter, target, SourceLocation(code.co_filename, line, code.co_name, text),
                            SourceLocation(code.co_filename, frame.f_lineno, code.co_name), scope["self"],
                            used_how="saved for backward at")
    return None


# The sentinel's half (NOTE [Silent classes without the write log]): a module's forward
# whose source writes ``.data`` from the old value gets its own parameters copied before it runs, and compared
# after; a parameter it changed that the output's graph uses is the finding.
_STATEMENTS: dict = {}  # forward code object -> its .data statements (empty for library forwards)
_GRAPH_NODES = 2000


def _forward_statements(module: torch.nn.Module) -> tuple:
    code = getattr(type(module).forward, "__code__", None)
    if code is None:
        return ()
    found = _STATEMENTS.get(code)
    if found is None:
        found = data_statements(code.co_filename, code.co_firstlineno, code.co_name) if _is_user(
            code.co_filename) else ()
        _STATEMENTS[code] = found
    return found


def parameters_before(module: torch.nn.Module) -> list | None:
    """(parameter, data pointer, copy) of ``module``'s own parameters when its forward writes ``.data`` from the
    old value; None for every other forward (one dict lookup)."""
    statements = _forward_statements(module)
    if not statements:
        return None
    parameters = {id(p): p for p in module._parameters.values() if p is not None and p.requires_grad}
    for target, _line, _text in statements:  # `self.fc.weight.data.div_(...)`: a submodule's parameter
        value = _resolve(target, module)  # None for a local alias: one of the module's own, taken above
        if isinstance(value, torch.nn.Parameter) and value.requires_grad:
            parameters[id(value)] = value
    return [(p, p.data_ptr(), p.detach().clone()) for p in parameters.values()]


def _uses(output, parameter: torch.Tensor) -> bool:
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    roots = [t.grad_fn for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    return any(getattr(node, "variable", None) is parameter for node in walk_nodes(roots, _GRAPH_NODES))


def changed_in_forward(module: torch.nn.Module, parameters: list, output) -> list[Finding]:
    """The findings for the parameters the forward changed (through ``.data``: their version did not move) and then
    used in the output's graph (NOTE [Every .data write of one forward in one finding] joins them)."""
    return [_changed(module, parameter) for parameter, pointer, before in parameters
            if (parameter.data_ptr() != pointer or not torch.equal(before, parameter.detach()))
            and _uses(output, parameter)]


def _changed(module: torch.nn.Module, parameter: torch.Tensor) -> Finding:
    """The finding for one parameter the forward changed and used: its write and its first use after it."""
    code = type(module).forward.__code__
    statements = _forward_statements(module)
    target, line, text = next((s for s in statements if _resolve(s[0], module) is parameter), statements[0])
    filename = code.co_filename
    # the parameter, or the submodule holding it (`self.fc(x)` uses `self.fc.weight`), read after the write
    parts = target.split(".")
    names = "|".join(re.escape(".".join(parts[:k])) for k in range(len(parts), 0, -1) if parts[:k] != ["self"])
    mention = re.compile(rf"(?<![\w.])(?:{names})\b(?!\.data)")
    function = function_node(filename, code.co_firstlineno, code.co_name)
    last = (function.end_lineno or line) if function is not None else line
    used_line = next((n for n in range(line + 1, last + 1) if mention.search(linecache.getline(filename, n))), line)
    used = SourceLocation(filename, used_line, code.co_name, linecache.getline(filename, used_line).strip())
    return _finding(parameter, target, SourceLocation(filename, line, code.co_name, text), used, module)


def _resolve(target: str, module):
    """``target`` (``self.fc.weight``) evaluated on ``module``; None for a local alias (`w = self.weight`), which is
    not known outside the forward."""
    try:
        return evaluate_reference(target, {"self": module})
    except Exception as error:
        log_fallback("torch.data_in_forward", f"resolving {target}", error)
        return None


def _finding(parameter, target: str, where: SourceLocation, used: SourceLocation, module,
             used_how: str = "used at") -> Finding:
    write = WriteRecord(op=".data write", location=where, via=f"{target}.data", bumps_version=False,
                        category="data_write")
    display = [("write", f"`{where.code}` at {where.short}, through .data"),
               ("used", f"{used_how} {used.short} (`{used.code}`)")]
    return tensor_finding("data_write_in_forward", parameter, target, "leaf", [write], display, None, target=target,
                          used_at=used.to_dict(), module=type(module).__name__)


# -- the sentinel's global module hooks --------------------------------------------------------------------------------
_CALL_IMPL = getattr(torch.nn.Module._call_impl, "__code__", None)


def _inside_another_module_call() -> bool:
    """Whether more than one ``Module._call_impl`` frame is on the stack: the one whose post-hook runs, and another."""
    calls = (frame for frame, _line in traceback.walk_stack(sys._getframe(1)) if frame.f_code is _CALL_IMPL)
    return next(calls, None) is not None and next(calls, None) is not None


# NOTE [The global-hooks warning of torch.compile]
# Since torch 2.5 calling a `torch.compile`d module warns whenever any global module hook is installed ("Using
# `torch.compile(module)` when there are global hooks on modules ..."). Ours would print it into a program that
# prints nothing without gradguard, so while they are installed that one warning is filtered out, unless global
# hooks of the user's own were there first (then torch warned without us too). The filter is removed on exit.
_COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"


# NOTE [Metadata-only in-place ops are no writes]
# `m.unsqueeze_(-1)` on a view of a module's input (HiDDeN's encoder: `m = message.unsqueeze(-1)`, then
# `m.unsqueeze_(-1)`) bumps the version counter the view shares with the input and changes none of its values.
# The post-hook reads a changed version as a write; so while the hooks are installed, the in-place ops that change
# only a view's shape or strides note the version they leave, per storage, and an input whose version moved only
# by such bumps was not written (its caller reads the values it passed). Autograd itself still counts those bumps
# against a saved view: that error is PyTorch's, and is diagnosed as usual.
_METADATA_INPLACE = ("unsqueeze_", "squeeze_", "t_", "transpose_", "swapdims_", "swapaxes_", "as_strided_")
_metadata_bumps: dict[int, set[int]] = {}  # storage address -> versions a metadata-only in-place op left


def _noting_metadata(original):
    def metadata_inplace(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if not torch.compiler.is_compiling():
            try:
                if len(_metadata_bumps) > 256:
                    _metadata_bumps.clear()
                _metadata_bumps.setdefault(self.untyped_storage().data_ptr(), set()).add(self._version)
            except Exception as error:  # a tensor without storage (a subclass, sparse): no note, the write stands
                log_fallback("torch.forward_hooks", "noting a metadata-only in-place op", error)
        return result
    return metadata_inplace


_METADATA_PATCHES = SharedPatches(lambda: [(torch.Tensor, name, _noting_metadata) for name in _METADATA_INPLACE])


def _only_metadata_bumps(tensor: torch.Tensor, version: int) -> bool:
    """Whether every version ``tensor`` went through since ``version`` was left by a metadata-only op."""
    if not _metadata_bumps:
        return False
    try:
        noted = _metadata_bumps.get(tensor.untyped_storage().data_ptr(), ())
    except Exception as error:
        log_fallback("torch.forward_hooks", "reading the metadata-only ops of a module's input", error)
        return False
    return all(v in noted for v in range(version + 1, tensor._version + 1))


class ForwardHooks:
    """The two global hooks of one guard session, and what the pre-hook passes to the post-hook."""

    def __init__(self, report) -> None:
        self._report = report  # session.report_extra
        self._stack: list = []  # per module call in progress: (module, (input versions, parameter copies) | None)
        self._writers: dict = {}  # id(tensor) -> the innermost module seen writing it (a ReLU in a Sequential)
        self._reported: set = set()
        self._pending: list = []  # NOTE [Every .data write of one forward in one finding]
        self._handles: list = []
        self._filter: tuple | None = None  # NOTE [The global-hooks warning of torch.compile]

    def install(self) -> None:
        from torch.nn.modules import module as nn_module

        if self._handles:  # installed already (a sampled guard puts them back each sampled cycle)
            return
        if not getattr(nn_module, "_has_any_global_hook", lambda: True)():
            warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
            self._filter = warnings.filters[0]
        self._handles = [nn_module.register_module_forward_pre_hook(self._before),
                         nn_module.register_module_forward_hook(self._after)]
        _METADATA_PATCHES.acquire()  # NOTE [Metadata-only in-place ops are no writes]

    def uninstall(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        if handles:
            _METADATA_PATCHES.release()
        if self._filter is not None:
            if self._filter in warnings.filters:
                warnings.filters.remove(self._filter)
                getattr(warnings, "_filters_mutated", lambda: None)()  # the module's cache of decisions
            self._filter = None
        self._stack.clear()
        self._pending.clear()
        self._writers.clear()  # modules are not kept past the guard

    def _before(self, module, args) -> None:
        if torch.compiler.is_compiling():
            # Dynamo traces global hooks into the compiled graph: touching our state there (even a push of the
            # module) makes it track that module twice and fail; compiled regions are watched by their saved
            # tensors. The post-hook below pops down to its own module, so an unpaired call is harmless.
            return
        if not torch.is_grad_enabled():
            self._stack.append((module, None))
            return
        inputs = [(t, t._version) for t in args if type(t) is torch.Tensor and not t.is_inference()]
        parameters = parameters_before(module)
        self._stack.append((module, (inputs, parameters) if inputs or parameters else None))

    def _after(self, module, args, output) -> None:
        if torch.compiler.is_compiling():  # see _before
            return
        stack = self._stack
        while stack and stack[-1][0] is not module:  # a forward that raised never reached its post-hook
            stack.pop()
        if not stack:
            return
        _module, entry = stack.pop()
        try:
            self._check(module, entry, output)
        finally:
            if not stack and _metadata_bumps:  # the outermost call ended: a storage's address may be reused next
                _metadata_bumps.clear()

    def _check(self, module, entry, output) -> None:
        if entry is None:
            self._flush_when_outermost()
            return
        inputs, parameters = entry
        try:
            finding = None
            for tensor, version in inputs:
                if tensor._version != version and not _only_metadata_bumps(tensor, version):
                    inner = self._writers.pop(id(tensor), None)
                    finding = caller_reads_again(module, tensor, inner)
                    if finding is not None:
                        break
                    self._writers[id(tensor)] = inner if inner is not None else module
                    if len(self._writers) > 64:
                        self._writers.clear()
            changed = changed_in_forward(module, parameters, output) if finding is None and parameters else []
        except Exception as error:  # only a check: the user's forward result stands
            log_fallback("torch.forward_hooks", "checking a module's forward for a silent write", error)
            return
        self._pending += changed
        if finding is not None:
            self._report_once(finding)
        self._flush_when_outermost()

    # NOTE [Every .data write of one forward in one finding]
    # A model whose forwards change parameters through `.data` usually does it in several places (a pruning mask
    # applied to every conv, in each block and in the stem). Raising at the first block's post-hook would name one
    # write; the outer forwards' writes, whose post-hooks run later, never. So these findings wait until the
    # outermost module call ends and are reported as one, every write listed. A forward that raised never reached
    # its post-hook and left its entry on the stack, so "outermost" is asked of the frames (only while a finding
    # waits): no other `Module._call_impl` encloses the call ending now. The user's error stands; what waited is
    # reported when the next outermost call ends.
    def _flush_when_outermost(self) -> None:
        if not self._pending or (self._stack and _inside_another_module_call()):
            return
        self._stack.clear()  # entries of forwards that raised: no module call is in progress
        first, *others = self._pending
        self._pending = []
        seen = {(w.location.file, w.location.line) for w in first.modified_at if w.location is not None}
        for other in others:
            for write in other.modified_at:
                where = (write.location.file, write.location.line) if write.location is not None else None
                if where not in seen:
                    seen.add(where)
                    first.modified_at.append(write)
        self._report_once(first)

    def _report_once(self, finding) -> None:
        key = (finding.kind, finding.modified_at[0].location.file, finding.modified_at[0].location.line)
        if key not in self._reported:
            self._reported.add(key)
            self._report(finding)
