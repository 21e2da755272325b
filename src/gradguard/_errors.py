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
]


class GradguardError(Exception):
    """Root of every exception gradguard raises."""


class InvalidArgument(GradguardError, TypeError):
    """A gradguard API was called with an argument it cannot use.

    Subclasses ``TypeError`` so code that guards API misuse with ``except TypeError`` keeps working.
    """


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
        return self.finding._repr_mimebundle_(include, exclude)


class InplaceModificationError(GradientHazardError):
    """A tensor needed for backward was modified in place (the version counter moved),
    or a tensor that autograd forbids writing in place was written."""


class SilentModificationError(GradientHazardError):
    """A tensor needed for backward changed without its version counter moving: PyTorch cannot see
    it and computes wrong gradients silently."""


class BackwardTwiceError(GradientHazardError):
    """Backward ran through a part of the graph whose saved tensors an earlier backward freed."""


def error_for(kind: str) -> type[GradientHazardError]:
    """The exception class raised for a saved-tensor finding of this kind."""
    return SilentModificationError if kind == "silent_write" else InplaceModificationError


def _render(finding) -> str:
    # Imported lazily: the renderer is not needed until an error is actually built.
    from .report._text import render_finding

    return render_finding(finding)
