"""Name a MindSpore tensor on the error path: ``net.w`` rather than ``float64[3]``; and the mode MindSpore runs in.

Like the torch and Paddle backends (:func:`gradguard.backends.adapter.name_by_memory`): a heap scan for
``nn.Cell`` objects, only when a finding is built, matching parameter memory.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn

from ..adapter import name_by_memory
from ...core.internal import log_fallback

__all__ = ["name_tensor", "memory_range", "current_mode"]


def current_mode() -> str:
    """``"graph"`` (GRAPH_MODE) or ``"pynative"``."""
    return "graph" if ms.get_context("mode") == ms.GRAPH_MODE else "pynative"


def memory_range(t):
    try:
        ptr = int(t.data_ptr())
        n = int(t.nbytes)
    except Exception as error:
        log_fallback("backends.mindspore", "reading data_ptr/nbytes", error)
        return None
    if not ptr or n <= 0:
        return None
    return 0, ptr, ptr + n


def name_tensor(t) -> tuple[str | None, str | None]:
    """(qualified name, "parameter") of the Cell parameter sharing ``t``'s memory, or (None, None)."""
    target = memory_range(t)
    if target is None:
        return None, None
    return name_by_memory(nn.Cell, lambda cell: cell.cells(),
                          lambda cell: (("parameter", name, p) for name, p in cell.parameters_and_names()),
                          lambda value: memory_range(value) == target)
