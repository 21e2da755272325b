"""Name a Paddle tensor on the error path: "net.fc.weight" rather than "linear_0.w_0" or "generated_tensor_3".

Same approach as the torch backend (see its NOTE [Why a heap scan, only on the error path]): scan the heap
for ``paddle.nn.Layer`` objects once, match parameter/buffer memory, and take the outermost layer's variable
name from the user's frames.
"""

from __future__ import annotations

import gc

import paddle

from ...core._frames import user_variable_names

__all__ = ["name_tensor", "memory_range"]


def memory_range(t) -> tuple[int, int, int] | None:
    """(storage key, start, end): Paddle exposes no storage object, so one address space (key 0) with
    absolute byte addresses. Views (slices, reshapes) fall inside their base's range."""
    try:
        ptr = t.data_ptr()
        n = int(t.size) * t.element_size()
    except Exception:
        return None
    if not ptr or n <= 0:
        return None
    return 0, ptr, ptr + n


def name_tensor(t) -> tuple[str | None, str | None]:
    """(qualified name, "parameter" | "buffer") of the layer tensor sharing ``t``'s memory, or (None, None)."""
    rng = memory_range(t)
    if rng is None:
        return None, None
    ptr = rng[1]
    layer_type = paddle.nn.Layer
    layers = [m for m in gc.get_objects() if issubclass(type(m), layer_type)]
    children = {id(c) for m in layers for c in m.children()}
    roots = [m for m in layers if id(m) not in children] + [m for m in layers if id(m) in children]
    variable = user_variable_names({id(m) for m in layers})
    for layer in roots:
        prefix = variable.get(id(layer), type(layer).__name__)
        for kind, items in (("parameter", layer.named_parameters()), ("buffer", layer.named_buffers())):
            for name, value in items:
                try:
                    if value is not None and value.data_ptr() == ptr:
                        return f"{prefix}.{name}", kind
                except Exception:
                    continue
    return None, None
