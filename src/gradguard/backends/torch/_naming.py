"""Name a tensor on the error path: "rnn.weight_hh_l0" rather than "[torch.FloatTensor [1, 1]]".

# NOTE [Why a heap scan, only on the error path]
# A global module forward hook would name parameters cheaply but crashes Dynamo ("... is already tracked
# for mutation"), so the guard installs nothing on modules. When a finding is built we scan the heap for
# ``nn.Module`` objects once, match parameter/buffer memory, and take the variable name of the outermost
# module from the user's frames (``rnn`` in ``rnn = nn.RNN(...)``).
"""

from __future__ import annotations

import gc

import torch

from ...core._frames import user_variable_names
from ...core._internal import log_fallback

__all__ = ["name_tensor", "storage_key"]


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def name_tensor(t: torch.Tensor) -> tuple[str | None, str | None]:
    """(qualified name, "parameter" | "buffer") of the module tensor sharing ``t``'s memory, or (None, None)."""
    try:
        key = storage_key(t)
    except Exception as error:  # no storage (e.g. sparse, fake)
        log_fallback("backends.torch", "reading a tensor's storage key", error)
        return None, None
    if key == 0:
        return None, None
    module_type = torch.nn.Module
    # ``type(m)`` and issubclass, not isinstance: isinstance triggers ``__class__`` properties of lazy
    # proxies on the heap (torch.distributed.reduce_op warns).
    modules = [m for m in gc.get_objects() if issubclass(type(m), module_type)]
    children = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in children] + [m for m in modules if id(m) in children]
    variable = user_variable_names({id(m) for m in modules})
    for module in roots:
        prefix = variable.get(id(module), type(module).__name__)
        for kind, items in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
            for name, value in items:
                if value is not None and value.device == t.device and storage_key(value) == key:
                    return f"{prefix}.{name}", kind
    return None, None
