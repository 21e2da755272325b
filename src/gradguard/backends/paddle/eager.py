"""Paddle's own in-place errors, explained: which tensor, which line, why, and the fix.

Paddle raises (3.3.1):
  * at the write: ``ValueError: (InvalidArgument) Leaf Tensor (generated_tensor_0) that doesn't stop gradient
    can't use inplace strategy.`` (``Leaf Var (linear_0.w_0) ...`` for method in-place ops);
  * at backward: ``RuntimeError: (PermissionDenied) Tensor '' used in gradient computation has been modified by
    an inplace operation. Its version is 1 but the expected version is 0...`` (no name, no line).
"""

from __future__ import annotations

import linecache
import re

import paddle

from ..._errors import GradientHazardError, InplaceModificationError
from ...core.diagnosis import diagnose
from ...core.facts import Facts
from ...core.findings import Finding, SaveSite, SourceLocation, TensorInfo, WriteRecord
from ...core.frames import innermost_user_entry
from ...core.source_ast import assignment_before, written_expression
from ...core.internal import log_fallback
from .session import name_tensor, paddle_fix

__all__ = ["enrich_paddle_error", "explain", "PaddleLeafInplaceError"]

LEAF = re.compile(r"Leaf (?:Tensor|Var) \(([^)]*)\) that doesn't stop gradient can't use inplace strategy")
VERSION = re.compile(r"Tensor '([^']*)' used in gradient computation has been modified by an inplace operation\. "
                     r"Its version is (\d+) but the expected version is (\d+)")


class PaddleLeafInplaceError(InplaceModificationError, ValueError):
    """In-place write on a leaf that requires grad. Also a ``ValueError``, as Paddle's own error is."""


def _site(error):
    entry = innermost_user_entry(error.__traceback__)
    if entry is None:
        return None, None, None
    frame = entry.tb_frame
    filename, line = frame.f_code.co_filename, entry.tb_lineno
    location = SourceLocation(filename, line, frame.f_code.co_name, linecache.getline(filename, line).strip())
    expression = written_expression(filename, line)
    value = None
    if expression:
        head, *rest = expression.split(".")
        scope = {**frame.f_globals, **frame.f_locals}
        value = scope.get(head)
        for attr in rest:
            value = getattr(value, attr, None)
    return location, expression, value


def _describe(tensor, expression, paddle_name) -> TensorInfo:
    if not isinstance(tensor, paddle.Tensor):
        return TensorInfo(shape=(), dtype="?", name=expression or paddle_name or None, role="tensor")
    name, role = name_tensor(tensor)
    if role is None:
        role = "leaf" if tensor.is_leaf else "activation"
        name = expression
    return TensorInfo(shape=tuple(int(s) for s in tensor.shape), dtype=str(tensor.dtype).replace("paddle.", ""),
                      name=name, role=role)


def explain(error: BaseException, session=None) -> Finding | None:
    """A finding for one of Paddle's in-place errors (usable without a guard), or None."""
    message = str(error)
    leaf = LEAF.search(message)
    if leaf is not None and isinstance(error, ValueError):
        return _leaf(error, leaf)
    version = VERSION.search(message)
    if version is not None:
        return _version(error, version)
    return None


def enrich_paddle_error(error: BaseException, session=None) -> GradientHazardError | None:
    if isinstance(error, GradientHazardError):
        return None
    try:
        finding = explain(error, session)
    except Exception as error:  # enrichment must never replace the user's error
        log_fallback("backends.paddle", "explaining an eager error", error)
        return None
    if finding is None:
        return None
    if finding.kind == "leaf_inplace":
        return PaddleLeafInplaceError(finding)
    return InplaceModificationError(finding)


# Paddle's words for the leaf row (core/eager_rules.py): the facts and the row are shared with torch; the text and
# the fix speak Paddle (stop_gradient, paddle.no_grad).
_LEAF_WORDS = (
    "Paddle accumulates gradients into leaf tensors that do not stop gradient (parameters, tensors created with "
    "stop_gradient=False). Writing one in place while recording gradients would replace the very values the leaf "
    "stands for (an optimizer step then updates from overwritten values), so Paddle refuses the write.",
    "For a parameter update or initialisation, write under `with paddle.no_grad():`. For a computation, write out of "
    "place (`y = paddle.sin(x)` instead of `x.sin_()`), or clone first (`y = x.clone(); y.sin_()`).")


def _leaf(error, match) -> Finding:
    location, expression, tensor = _site(error)
    info = _describe(tensor, expression, match.group(1))
    made = None
    if location is not None and expression and info.role not in ("parameter", "buffer"):
        made = assignment_before(location.file, location.line, expression)
    finding = Finding(
        kind="leaf_inplace", tensor=info,
        modified_at=[WriteRecord(op="in-place write", location=location)] if location else [],
        backend="paddle",
        facts=Facts(mode="eager (dygraph)", display=[("paddle name", match.group(1))], eager_check="leaf",
                    written=expression, made_at=made, paddle_message=str(error).split("\n")[0],
                    leaf_words=_LEAF_WORDS),
    )
    return diagnose(finding)


def _version(error, match) -> Finding:
    location, _expression, _tensor = _site(error)
    name, now, expected = match.group(1), int(match.group(2)), int(match.group(3))
    display = [("backward at", f"{location.short}: {location.code}")] if location is not None else []
    finding = Finding(
        kind="inplace_modification",
        tensor=TensorInfo(shape=(), dtype="?", name=name or None, role="tensor"),
        saved_at=SaveSite(),
        versions={"saved": expected, "now": now},
        backend="paddle",
        facts=Facts(mode="eager (dygraph)", display=display, paddle_message=str(error).split("\n")[0]),
    )
    finding.notes.append("Paddle's message names neither the tensor nor the line. The tensor was saved before "
                         "gradguard.guard() was entered, so gradguard did not see the save or the write; inside the "
                         "guard the diagnosis names both.")
    diagnose(finding)
    return paddle_fix(finding)
