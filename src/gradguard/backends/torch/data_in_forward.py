"""A module's forward changing its own parameter through ``.data`` before using it.

Checked when the forward saves the parameter for backward (write log / forensic mode): the saving frame is a
module's ``forward``; its source is scanned once for ``.data`` writes that depend on the old value
(core/data_statements.py), and a write before the saving line whose target is the saved parameter is the
finding. The normalisation it performs is invisible to autograd: the gradient is computed as if the stored
weight were used, then applied to the normalised one.
"""

from __future__ import annotations

import linecache
import re
import sys

import torch

from ...core.data_statements import data_statements
from ...core.facts import Facts
from ...core.findings import Finding, SourceLocation, WriteRecord
from ...core.frames import user_frames
from ...core.internal import log_fallback
from ...core.source_ast import evaluate_reference, function_node
from .backward_calls import _is_user
from .graph import walk_nodes
from .naming import tensor_info

__all__ = ["parameter_of", "data_write_before_save", "parameters_before", "changed_in_forward"]


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


# The sentinel's half (NOTE [Silent classes without the write log], forward_hooks.py): a module's forward
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


def changed_in_forward(module: torch.nn.Module, parameters: list, output) -> Finding | None:
    """The finding for a parameter the forward changed (through ``.data``: its version did not move) and then used
    in the output's graph, every such write listed; None when no parameter changed or the output does not depend
    on the changed one."""
    found = None
    for parameter, pointer, before in parameters:
        if parameter.data_ptr() == pointer and torch.equal(before, parameter.detach()):
            continue
        if not _uses(output, parameter):
            continue
        finding = _changed(module, parameter)
        if found is None:
            found = finding
        elif all(w.location != finding.modified_at[0].location for w in found.modified_at):
            found.modified_at.append(finding.modified_at[0])  # every parameter the forward changed: one finding
    return found


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
    return Finding(
        kind="data_write_in_forward",
        tensor=tensor_info(parameter, target, "leaf", None),
        modified_at=[write],
        facts=Facts(target=target, used_at=used.to_dict(), module=type(module).__name__,
                    display=[("write", f"`{where.code}` at {where.short}, through .data"),
                             ("used", f"{used_how} {used.short} (`{used.code}`)")]),
    )
