"""A gradient read from a tensor autograd computed: PyTorch keeps ``.grad`` only for leaves (and for tensors that
called ``retain_grad()``), so the read gets None and the user's own next step fails ("'NoneType' object has no
attribute 'sign'"). PyTorch only warns at the read. This probe names the tensor and where it was made; the row in
``core/eager_rules.py`` says why and the fix.

# NOTE [A gradient read from a tensor that is no leaf]
# PGD written as `x_adv = x_adv + alpha * x_adv.grad.sign()` turns the leaf it started from into a computed tensor:
# from the second step on, `x_adv.grad` is None. When the user's error is an AttributeError or TypeError about None
# on a line that reads `<reference>.grad`, and that reference holds, in the failing frame, a computed tensor that
# requires grad and keeps no gradient, the finding names it and where it was made: the forward line the session
# noted for its node (the assignment of the previous iteration in a loop), else the last assignment before the
# read. The fix keeps its gradient there (`x_adv.retain_grad()` right after it is made).
# A leaf that does not require grad (an input image given to a saliency map without `requires_grad_()`) reads None
# the same way: the fix is `x.requires_grad_()` where it is made, before the forward reads it.
# The same tensor handed to an optimizer (`w = torch.randn(4, requires_grad=True) / 2`, then `SGD([w, b])`) is
# refused at once ("can't optimize a non-leaf Tensor"): the finding names the computed tensor among those the
# failing line passes, and the fix makes it a leaf where it is made.
"""

from __future__ import annotations

import ast

import torch

from ...core.facts import Facts
from ...core.findings import Finding, SourceLocation
from ...core.fixes import assigned_names, statement_code
from ...core.frames import user_variable_names
from ...core.source_ast import assignment_before, statement_at
from .backward_calls import _lookup
from .graph import tensor_info

__all__ = ["NONE_ERRORS", "NON_LEAF_PARAM", "grad_read_of_non_leaf", "optimizer_of_non_leaf"]

NONE_ERRORS = (AttributeError, TypeError)
NON_LEAF_PARAM = "can't optimize a non-leaf Tensor"  # torch.optim's ValueError


def grad_read_of_non_leaf(error: BaseException, frame, location: SourceLocation,
                          node_sites: dict) -> Finding | None:
    """The finding for ``error`` (raised at ``location``, in ``frame``) when it comes from a ``.grad`` read of a
    computed tensor (NOTE [A gradient read from a tensor that is no leaf]); None otherwise."""
    if "NoneType" not in str(error):
        return None
    statement = statement_at(location.file, location.line)
    reads = [node.value for node in ast.walk(statement) if isinstance(node, ast.Attribute) and node.attr == "grad"
             and isinstance(node.value, (ast.Name, ast.Attribute, ast.Subscript))] if statement is not None else []
    for read in reads:
        name = ast.unparse(read)
        value = _lookup(name, frame)
        if not isinstance(value, torch.Tensor) or value.retains_grad:
            continue
        node = value.grad_fn
        if node is None and value.requires_grad:  # a leaf that requires grad: its None is no autograd matter
            continue
        # a computed tensor: where the session saw its node made, when that statement binds this name (inside a
        # helper the value has another name: then the caller's assignment); a leaf without requires_grad: the
        # assignment before the read
        entry = node_sites.get((node.name(), node._sequence_nr())) if node is not None else None
        if entry is not None and entry[0].file == location.file and name in assigned_names(statement_code(entry[0])):
            made, spelt = entry[0], name
        else:
            made, spelt = _bound(name, value, frame)
        facts = Facts(display=[], torch_message=f"{type(error).__name__}: {error}",
                      eager_check="non_leaf_grad" if node is not None else "grad_not_required",
                      receiver=spelt, made_at=made)
        facts.backward_at = location.to_dict()  # the read: where the error surfaced
        return Finding(kind="non_leaf_grad", tensor=tensor_info(value, name, "activation" if node is not None
                                                                else "leaf"), facts=facts)
    return None


def _bound(name: str, value: torch.Tensor, frame) -> tuple[SourceLocation | None, str]:
    """(the assignment that bound ``value``, the name it binds there): the last one before the frame's line in the
    frame's own function, else, frame by frame outwards, in the caller that holds the same tensor in a variable (a
    function's argument: the caller's `x = torch.rand(...)`)."""
    spelt: str | None = name
    while frame is not None and spelt is not None:
        code = frame.f_code
        made = assignment_before(code.co_filename, frame.f_lineno, spelt)
        if made is not None and made.line >= code.co_firstlineno:
            return made, spelt
        frame = frame.f_back
        spelt = next((k for k, v in list(frame.f_locals.items()) if v is value and not k.startswith("_")),
                     None) if frame is not None else None
    return None, name


def optimizer_of_non_leaf(error: BaseException, frame, location: SourceLocation) -> Finding | None:
    """The finding for torch.optim's "can't optimize a non-leaf Tensor" raised at ``location``: the computed tensor
    among those the line passes (directly, or in a list, tuple or dict of parameter groups)."""
    statement = statement_at(location.file, location.line)
    references = [ast.unparse(node) for node in ast.walk(statement)
                  if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript))] if statement is not None else []
    values = [_lookup(reference, frame) for reference in references]
    spelt = {id(v): r for r, v in zip(references, values) if isinstance(v, torch.Tensor)}  # `self.scale` as written
    computed: list[torch.Tensor] = []
    pending = list(values)
    while pending and len(computed) < 64:
        value = pending.pop(0)
        if isinstance(value, torch.Tensor):
            if value.grad_fn is not None and all(value is not c for c in computed):
                computed.append(value)
        elif isinstance(value, (list, tuple)):
            pending += list(value)[:64]
        elif isinstance(value, dict):
            pending.append(value.get("params"))
    names = {**user_variable_names({id(t) for t in computed}, start=frame), **spelt}
    named = next(((t, names[id(t)]) for t in computed if id(t) in names), None)
    if named is None:
        return None
    value, name = named
    made, spelt = _bound(name, value, frame)  # in the function that assigns it, as the grad read's is found
    facts = Facts(display=[], torch_message=f"{type(error).__name__}: {error}", eager_check="non_leaf_param",
                  receiver=spelt, made_at=made)
    facts.backward_at = location.to_dict()  # the optimizer's construction: where the error surfaced
    return Finding(kind="non_leaf_param", tensor=tensor_info(value, name, "activation"), facts=facts)
