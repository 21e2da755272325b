"""A module writing into its caller's tensor, which the caller then reads again.

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
"""

from __future__ import annotations

import ast
import linecache
import sys
import weakref
from dataclasses import dataclass

import torch

from ...core.facts import Facts
from ...core.findings import Finding, SourceLocation, WriteRecord
from ...core.frames import is_gradguard_file, is_plumbing, location_of
from ...core.later_reads import Span, later_reads, position_of, span_contains
from ...core.source_ast import function_node
from .backward_calls import _is_user
from .naming import tensor_info

__all__ = ["PendingRead", "MAX_PENDING", "written_input", "read_of", "finding", "caller_reads_again"]

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
            pending = _pending_read(func, target, frame, names, (outer, inner), writing)
            if pending is not None:
                return pending
    return None


def _pending_read(func, target: torch.Tensor, frame, names: tuple[str, ...], modules: tuple, writing
                  ) -> PendingRead | None:
    """The read of ``target`` (bound to ``names``) the caller's ``frame`` makes after the module call, or None.
    ``modules``: the outermost and innermost module called; ``writing``: the user frame that wrote, if any."""
    outer, inner = modules
    span = position_of(frame)
    reads = later_reads(frame.f_code, span, frozenset(names)) if span is not None else None
    if not reads:
        return None
    op = func.name().replace("::", ".")
    inside = None
    if writing is not None and writing is not frame:
        inside = WriteRecord(op=op, location=location_of(writing), category="module_input",
                             via=f"inside {type(inner).__name__}.{writing.f_code.co_name}")
    return _pending(target, frame, span, names, reads, op, (outer, inner), inside)


def _pending(target: torch.Tensor, frame, span: Span, names: tuple, reads: tuple, op: str, modules: tuple,
             inside: WriteRecord | None = None) -> PendingRead:
    outer, inner = modules
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
    return Finding(
        kind="module_input_write",
        tensor=tensor_info(t, name, "activation" if pending.producer else "leaf", pending.producer),
        modified_at=[pending.write] + ([pending.inside] if pending.inside is not None else []),
        facts=Facts(name=name, module=module, call=call.to_dict(), read=read.to_dict(),
                    module_rank=list(pending.rank) if pending.rank else None, display=display),
    )


def caller_reads_again(module: torch.nn.Module, target: torch.Tensor, inner=None) -> Finding | None:
    """Seen after ``module``'s forward changed the version of ``target``, one of its inputs (the global forward
    hook, NOTE [Silent classes without the write log] in forward_hooks.py): the finding when the frame that
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
