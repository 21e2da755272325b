"""Name a MindSpore tensor on the error path: ``net.w`` rather than ``float64[3]``.

Like the torch and Paddle backends: a heap scan for ``nn.Cell`` objects, only when a finding is built,
matching parameter memory, with the outermost cell named by its variable in the user's frames.
"""

from __future__ import annotations

import gc

from mindspore import nn

from ...core._frames import user_variable_names
from ._adapter import memory_range

__all__ = ["name_tensor"]


def name_tensor(t) -> tuple[str | None, str | None]:
    """(qualified name, "parameter") of the Cell parameter sharing ``t``'s memory, or (None, None)."""
    target = memory_range(t)
    if target is None:
        return None, None
    cells = [c for c in gc.get_objects() if issubclass(type(c), nn.Cell)]
    children = {id(child) for c in cells for child in c.cells()}
    roots = [c for c in cells if id(c) not in children]
    variables = user_variable_names({id(c) for c in roots})
    for cell in roots:
        prefix = variables.get(id(cell), type(cell).__name__)
        for name, parameter in cell.parameters_and_names():
            if memory_range(parameter) == target:
                return f"{prefix}.{name}", "parameter"
    return None, None
