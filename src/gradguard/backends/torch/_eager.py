"""Errors PyTorch raises eagerly (at the write, or at a second backward): add what it does not say.

PyTorch checks these in its autograd kernels before any Python hook or mode sees the op, so the guard
recognises them by message when they leave the guarded block, and reads the user's frame to name the tensor.
"""

from __future__ import annotations

import re
import types

import torch

from ..._errors import BackwardTwiceError, GradientHazardError, InplaceModificationError
from ...core._diagnosis import diagnose
from ...core._findings import Finding, SaveSite, SourceLocation, TensorInfo, WriteRecord
from ...core._frames import LIBRARY_PATHS
from ...core._source_ast import assignment_before, written_expression
from ._naming import name_tensor

__all__ = ["enrich_eager_error"]

_LEAF = "a leaf Variable that requires grad is being used in an in-place operation"
_VIEW_OF_LEAF = "a view of a leaf Variable that requires grad is being used in an in-place operation"
_MULTI_VIEW = re.compile(r"Output \d+ of (\w+) is a view and is being modified inplace\. This view is the output "
                         r"of a function that returns multiple views")
_NO_GRAD_VIEW = "A view was created in no_grad mode and is being modified inplace with grad mode enabled"
_FUNCTION_VIEW = re.compile(r"Output \d+ of (\w+) is a view and is being modified inplace\. This view was created "
                            r"inside a custom Function")
_BACKWARD_TWICE = "Trying to backward through the graph a second time"


def _user_frame(tb: types.TracebackType | None):
    """Innermost traceback entry in user code."""
    found = None
    while tb is not None:
        if not LIBRARY_PATHS.is_library(tb.tb_frame.f_code.co_filename):
            found = tb
        tb = tb.tb_next
    return found


def _lookup(expression: str, frame) -> object:
    head, *rest = expression.split(".")
    scope = {**frame.f_globals, **frame.f_locals}
    if head not in scope:
        return None
    value = scope[head]
    for attr in rest:
        value = getattr(value, attr, None)
    return value


def _describe(tensor, expression: str | None) -> TensorInfo:
    if not isinstance(tensor, torch.Tensor):
        return TensorInfo(shape=(), dtype="?", name=expression, role="tensor")
    name, role = name_tensor(tensor)
    if role is None:
        role = "leaf" if tensor.is_leaf else ("view" if tensor._is_view() else "activation")
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
                return InplaceModificationError(builder(error, match))
    except Exception:  # an enrichment failure must never replace the user's error
        return None
    return None


def _write_site(error):
    entry = _user_frame(error.__traceback__)
    if entry is None:
        return None, None, None, None
    frame = entry.tb_frame
    filename, line = frame.f_code.co_filename, entry.tb_lineno
    import linecache

    location = SourceLocation(filename, line, frame.f_code.co_name, linecache.getline(filename, line).strip())
    expression = written_expression(filename, line)
    tensor = _lookup(expression, frame) if expression else None
    return location, expression, tensor, frame


def _finding(kind, error, headline_rule, why, fix, display=()) -> Finding:
    location, expression, tensor, _frame = _write_site(error)
    info = _describe(tensor, expression)
    writes = [WriteRecord(op="in-place write", location=location)] if location else []
    made = None
    if location is not None and expression and info.role not in ("parameter", "buffer"):
        made = assignment_before(location.file, location.line, expression)
    extra = list(display)
    if made is not None:
        extra.append(("created at", f"{made.short}: {made.code}"))
    elif info.role == "parameter":
        extra.append(("created at", "a module parameter (leaf tensor created by nn.Module)"))
    finding = Finding(kind=kind, tensor=info, modified_at=writes, explanation=why, suggestion=fix,
                      rule=headline_rule, context={"display": extra, "torch_message": str(error)})
    return diagnose(finding)


def _leaf(error, _match) -> Finding:
    return _finding(
        "leaf_inplace", error, "leaf_inplace",
        "Autograd accumulates gradients into leaf tensors (parameters, tensors created with requires_grad=True); "
        "writing one in place while grad mode is on would make its gradient refer to values that no longer exist, "
        "so PyTorch refuses the write.",
        "For a parameter update, do it under `with torch.no_grad():` (as optimizers do). For a computation, write "
        "it out of place (`x = x + 1`), or clone first (`y = x.clone(); y.add_(1)`).",
    )


def _view_of_leaf(error, _match) -> Finding:
    finding = _finding(
        "leaf_inplace", error, "view_of_leaf_inplace",
        "The written tensor is a view (slice, index, reshape) of a leaf tensor that requires grad; writing the view "
        "writes the leaf, which autograd forbids under grad mode.",
        "Initialise or update the leaf under `with torch.no_grad():` (e.g. `with torch.no_grad(): w[0] = 1`), or "
        "build a new tensor out of place (`w2 = w.clone(); w2[0] = 1` or `torch.where(...)`).",
    )
    return finding


def _multi_view(error, match) -> Finding:
    op = match.group(1)
    return _finding(
        "view_inplace", error, "multi_output_view_inplace",
        f"The tensor is one of several views returned together by {op} (unbind/split/chunk). Autograd cannot "
        "track an in-place write into one of them, because the views share one backward node.",
        "Write out of place (`a = a * 2`), or clone the piece first (`a = a.clone()`), or index instead of "
        "unbinding (`a = x[:, 0]` returns a single view that can be written).",
        display=[("view of", op)],
    )


def _no_grad_view(error, _match) -> Finding:
    return _finding(
        "view_inplace", error, "no_grad_view_inplace",
        "The view was created under torch.no_grad() and is written with grad mode on: autograd does not know whether "
        "the write should be tracked, so it refuses.",
        "Create the view and write it in the same mode: both inside `with torch.no_grad():` (untracked update), or "
        "both outside (tracked); or write into a clone of the view.",
    )


def _function_view(error, match) -> Finding:
    op = match.group(1)
    return _finding(
        "view_inplace", error, "custom_function_view_inplace",
        f"The tensor is a view returned by the custom autograd Function {op}; autograd cannot rebase the Function's "
        "backward on an in-place write into its output.",
        f"Write out of place, or clone the output (`y = y.clone()`), or make {op}.forward return a fresh tensor "
        "(not a view of an input).",
        display=[("view from", op)],
    )


def _backward_twice(error, session) -> Finding:
    location, _expression, _tensor, _frame = _write_site(error)
    earlier = session.backward_sites[-1] if session is not None and session.backward_sites else None
    display = []
    if location is not None:
        display.append(("backward at", f"{location.short}: {location.code}"))
    if earlier is not None:
        display.append(("freed by", f"an earlier backward at {earlier.short}: {earlier.code}"))
    finding = Finding(
        kind="backward_twice",
        tensor=TensorInfo(shape=(), dtype="?", role="graph"),
        saved_at=SaveSite(),
        explanation="An earlier backward freed the saved tensors of part of this graph (backward frees them unless "
        "retain_graph=True). This backward reaches that part again: usually a tensor from a previous iteration "
        "(an RNN hidden state, a running average, a cached embedding) was carried into this iteration without "
        ".detach(), or the same loss is backpropagated twice.",
        suggestion="Detach what you carry across iterations (`h = h.detach()`), so each backward only covers its own "
        "iteration. Pass retain_graph=True to the earlier backward only if you really need to backpropagate through "
        "the same graph twice (and then do not step the optimizer in between).",
        rule="backward_twice",
        context={"display": display, "torch_message": str(error)},
    )
    return diagnose(finding)
