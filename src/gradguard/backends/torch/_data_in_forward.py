"""A module's forward changing its own parameter through ``.data`` before using it (issue 14, class 7).

Checked when the forward saves the parameter for backward (write log / forensic mode): the saving frame is a
module's ``forward``; its source is scanned once for ``.data`` writes that depend on the old value
(core/_data_statements.py), and a write before the saving line whose target is the saved parameter is the
finding. The normalisation it performs is invisible to autograd: the gradient is computed as if the stored
weight were used, then applied to the normalised one.
"""

from __future__ import annotations

import sys

import torch

from ...core._data_statements import data_statements
from ...core._findings import Finding, SourceLocation, TensorInfo, WriteRecord
from ...core._frames import user_frames
from ...core._source_ast import evaluate_reference

__all__ = ["parameter_of", "data_write_before_save"]


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
            write = WriteRecord(op=".data write", location=SourceLocation(code.co_filename, line, code.co_name, text),
                                via=f"{target}.data", bumps_version=False, category="data_write")
            saved = SourceLocation(code.co_filename, frame.f_lineno, code.co_name)
            info = TensorInfo(shape=tuple(parameter.shape), dtype=str(parameter.dtype).replace("torch.", ""),
                              device=str(parameter.device), name=target, role="leaf", producer=None)
            return Finding(
                kind="data_write_in_forward",
                tensor=info,
                modified_at=[write],
                context={"target": target, "used_at": saved.to_dict(), "module": type(scope["self"]).__name__,
                         "display": [("write", f"`{text}` at {write.location.short}, through .data"),
                                     ("used", f"saved for backward at {saved.short} (`{saved.code}`)")]},
            )
    return None
