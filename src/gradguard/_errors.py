"""The exception hierarchy: one root, so ``except gradguard.GradguardError`` catches all of ours."""

from __future__ import annotations

__all__ = [
    "GradguardError",
    "InvalidArgument",
    "GradientHazardError",
    "InplaceModificationError",
    "SilentModificationError",
    "BackwardTwiceError",
    "InternalError",
    "NotWatched",
]


class GradguardError(Exception):
    """Root of every exception gradguard raises."""


class InvalidArgument(GradguardError, TypeError):
    """A gradguard API was called with an argument it cannot use.

    Subclasses ``TypeError`` so code that guards API misuse with ``except TypeError`` keeps working.
    """


class NotWatched(UserWarning):
    """gradguard stepped aside for part of the program it cannot watch (a ``torch.func`` transform, a sparse or
    nested tensor, ...): that part ran exactly as without gradguard, unchecked. One warning per kind per guard."""


class InternalError(GradguardError):
    """gradguard itself failed. Never raised in place of the user's own error."""


class GradientHazardError(GradguardError, RuntimeError):
    """A gradient hazard was found. ``.finding`` holds the structured diagnosis; ``.findings`` every hazard
    found at once (the first is ``.finding``).

    Subclasses ``RuntimeError`` because PyTorch raises ``RuntimeError`` for the same situations:
    existing ``except RuntimeError`` handlers keep working under the guard.
    """

    def __init__(self, finding):
        self.finding = finding
        self.findings = [finding]  # every hazard found at once, ``finding`` first (see NOTE [All hazards in one error])
        super().__init__(_render(finding))

    def _repr_mimebundle_(self, include=None, exclude=None):
        # The notebook shows the finding's HTML; the plain-text form is the whole message (the framework's own
        # sentence first, as ``str(error)``), so logs and text-only frontends read what ``match=`` reads.
        bundle = dict(self.finding._repr_mimebundle_(include, exclude))
        if "text/plain" in bundle:
            bundle["text/plain"] = str(self)
        return bundle


class InplaceModificationError(GradientHazardError):
    """A tensor needed for backward was modified in place (the version counter moved),
    or a tensor that autograd forbids writing in place was written."""


class SilentModificationError(GradientHazardError):
    """A tensor needed for backward changed without its version counter moving: PyTorch cannot see
    it and computes wrong gradients silently."""


class BackwardTwiceError(GradientHazardError):
    """Backward ran through a part of the graph whose saved tensors an earlier backward freed."""


class NonLeafGradError(GradientHazardError, AttributeError):
    """A gradient read from a tensor autograd computed (not a leaf) was None, and the line failed on it. Subclasses
    ``AttributeError``, what that line raised (``'NoneType' object has no attribute ...``), so ``except
    AttributeError`` handlers keep working under the guard."""


class NonLeafParamError(GradientHazardError, ValueError):
    """An optimizer was given a tensor autograd computed (not a leaf): torch.optim's ``ValueError`` ("can't optimize
    a non-leaf Tensor") with the finding; subclasses ``ValueError``."""


class NonLeafGradTypeError(GradientHazardError, TypeError):
    """As ``NonLeafGradError``, where the line raised ``TypeError`` (``unsupported operand type(s) ...
    'NoneType'``): subclasses ``TypeError``."""


def error_for(kind: str) -> type[GradientHazardError]:
    """The exception class raised for a saved-tensor finding of this kind."""
    from .core.findings import SILENT_KINDS

    return SilentModificationError if kind in SILENT_KINDS else InplaceModificationError


# NOTE [The framework's own words come first]
# Code written against PyTorch matches its messages (`pytest.raises(RuntimeError, match="modified by an inplace
# operation")`, `except RuntimeError as e: if "backward through the graph a second time" in str(e)`). Under the
# guard PyTorch's own version check is off (saved-tensor hooks replace it) and gradguard raises instead, so the
# error's text starts with the sentence PyTorch would have written (or did write, for the eager errors gradguard
# enriches), then gradguard's diagnosis.
_TORCH_TYPE_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
                     "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
                     "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}


def framework_message(finding) -> str | None:
    """The message the framework raised (or, for torch's version check, would have raised) for this finding."""
    facts = getattr(finding, "facts", None)
    if facts is not None and facts.torch_message:
        return str(facts.torch_message)
    versions = finding.versions or {}
    if finding.kind != "inplace_modification" or finding.backend != "torch" or versions.get("now") is None:
        return None
    tensor = finding.tensor
    kind = _TORCH_TYPE_NAMES.get(tensor.dtype, "")
    device = "" if tensor.device == "cpu" else f"{tensor.device.split(':')[0]}."
    shape = "[" + ", ".join(str(size) for size in tensor.shape) + "]"
    producer = f", which is an output of {tensor.producer}," if tensor.producer else ""
    return (f"one of the variables needed for gradient computation has been modified by an inplace operation: "
            f"[torch.{device}{kind}Tensor {shape}]{producer} is at version {versions['now']}; expected version "
            f"{versions.get('saved')} instead.")


def _render(finding) -> str:
    # Imported lazily: the renderer is not needed until an error is actually built.
    from .report.text import render_finding

    original = framework_message(finding)
    text = render_finding(finding)
    return f"{original}\n\ngradguard: {text}" if original else text
