"""PyTorch's "element 0 of tensors does not require grad and does not have a grad_fn": a backward (or
``torch.autograd.grad``) of a tensor autograd never recorded. This probe finds where the graph stopped being
recorded, from the user's source and the values in the failing frame; the rows of ``core/eager_rules.py`` say why
and the fix.

# NOTE [Where the graph stopped]
# Two causes can be read off the program and repaired by one keyword. A gradient from ``torch.autograd.grad``
# called without create_graph=True is a constant: differentiating it again (a PINN's second derivative, a
# gradient penalty) finds no graph. The names the failing call backpropagates are followed back through their
# assignments, while their values carry no graph, to such a call. A reentrant checkpoint
# (``checkpoint(..., use_reentrant=True)``, torch's default) records a graph only when one of its tensor inputs
# requires grad: with a frozen embedding in front, nothing does. Any other cause (no_grad, a detach, numbers through numpy) is explained
# without an edit: which of them the user meant cannot be read off the program.
"""

from __future__ import annotations

import ast

import torch

from ...core.facts import Facts
from ...core.findings import Finding, SourceLocation, TensorInfo
from ...core.source_ast import assignment_before, backward_receiver, parse_file, statement_at
from .backward_calls import _lookup, user_frames_of

__all__ = ["NO_GRAPH", "missing_graph", "passes_true"]

NO_GRAPH = "does not require grad and does not have a grad_fn"
_FOLLOWED = 16  # names followed back from the failing call, at most


def missing_graph(frame, location: SourceLocation, message: str) -> Finding:
    """The finding for a backward at ``location`` (in ``frame``) of a tensor with no graph (PyTorch's ``message``)."""
    receiver = backward_receiver(location.code)
    value = _lookup(receiver, frame) if receiver else None
    made = assignment_before(location.file, location.line, receiver) if receiver else None
    cut = _constant_gradient(frame, location, receiver) or _reentrant_checkpoint(frame)
    tensor = TensorInfo(tuple(value.shape), str(value.dtype).replace("torch.", ""), str(value.device), receiver,
                        "activation") if isinstance(value, torch.Tensor) else TensorInfo((), "?", name=receiver)
    facts = Facts(display=[], torch_message=message, eager_check="no_graph", receiver=receiver, made_at=made,
                  graph_cut=cut)
    facts.backward_at = location.to_dict()
    return Finding(kind="no_graph", tensor=tensor, facts=facts)


def _no_graph(value) -> bool:
    return isinstance(value, torch.Tensor) and value.grad_fn is None and not value.requires_grad


def _constant_gradient(frame, location: SourceLocation, receiver: str | None) -> dict | None:
    """``{"cause": "constant_gradient", "file", "line", "code", "call"}``: the ``torch.autograd.grad`` call without
    create_graph=True whose result the failing call backpropagates (NOTE [Where the graph stopped])."""
    pending, seen = [receiver] if receiver else [], set()
    while pending and len(seen) < _FOLLOWED:
        name = pending.pop(0)
        if name in seen or not _no_graph(_lookup(name, frame)):
            continue
        seen.add(name)
        made = assignment_before(location.file, location.line, name)
        statement = statement_at(location.file, made.line) if made is not None else None
        if statement is None or made is None or made.line < frame.f_code.co_firstlineno:
            continue
        for call in (n for n in ast.walk(statement) if isinstance(n, ast.Call)):
            callee = ast.unparse(call.func)
            if callee.endswith("autograd.grad") and not passes_true(call, "create_graph"):
                return {"cause": "constant_gradient", "file": made.file, "line": made.line, "code": made.code,
                        "call": callee}
        pending += [n.id for n in ast.walk(statement) if isinstance(n, ast.Name)]
    return None


def _reentrant_checkpoint(frame) -> dict | None:
    """``{"cause": "reentrant_checkpoint", "file", "line", "code", "call"}``: a reentrant checkpoint call in a file
    of the user's frames (NOTE [Where the graph stopped])."""
    files = dict.fromkeys(f.f_code.co_filename for f in user_frames_of(frame))
    for file in files:
        tree = parse_file(file)
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)) if tree is not None else ():
            callee = ast.unparse(call.func)
            reentrant = next((k.value for k in call.keywords if k.arg == "use_reentrant"), None)  # absent: True
            if callee.split(".")[-1] == "checkpoint" and not (isinstance(reentrant, ast.Constant)
                                                             and reentrant.value is False):
                statement = statement_at(file, call.lineno)
                line = statement.lineno if statement is not None else call.lineno
                return {"cause": "reentrant_checkpoint", "file": file, "line": line,
                        "code": ast.unparse(statement) if statement is not None else callee, "call": callee}
    return None


def passes_true(call: ast.Call, keyword: str) -> bool:
    """Whether the call passes ``keyword=True``."""
    return any(k.arg == keyword and isinstance(k.value, ast.Constant) and k.value.value is True for k in call.keywords)
