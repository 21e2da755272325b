"""Notices gradguard writes through the user's warning filters, without ever raising inside a framework."""

from __future__ import annotations

import sys
import warnings
from types import FrameType

from .frames import LIBRARY_PATHS

__all__ = ["notice"]


def notice(message: str, category: type[Warning], stacklevel: int | None = None) -> None:
    """``warnings.warn`` that never raises, attributed to the user's line (``stacklevel``: None for the innermost
    frame outside gradguard, torch and the standard library's context managers).

    # NOTE [A notice never raises inside torch]
    # Notices are emitted from saved-tensor hooks and from torch.func's hook switch. Under ``-W error`` or
    # ``PYTHONWARNINGS=error`` the user's filters turn a warning into an exception, which then unwinds through
    # PyTorch's hook stack (an INTERNAL ASSERT in SavedTensorHooks.cpp) and fails a legal program. The user's
    # filters still decide ("ignore" hides the notice); an "error" filter is shown as the warning it is, on
    # stderr, instead of raising.
    """
    frame: FrameType | None
    if stacklevel is None:
        stacklevel, frame = 2, sys._getframe(1)  # stacklevel 1 is this function
        while frame is not None and LIBRARY_PATHS.is_library(frame.f_code.co_filename):
            stacklevel, frame = stacklevel + 1, frame.f_back
        if frame is None:
            stacklevel = 2
    try:
        warnings.warn(message, category, stacklevel=stacklevel)
    except Warning as raised:
        frame = sys._getframe(min(stacklevel - 1, _depth() - 1))
        warnings.showwarning(raised, category, frame.f_code.co_filename, frame.f_lineno)


def _depth() -> int:
    frame: FrameType | None
    depth, frame = 0, sys._getframe(1)
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return depth
