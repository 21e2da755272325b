"""Name a Paddle tensor on the error path: "net.fc.weight" rather than "linear_0.w_0" or "generated_tensor_3".

Same approach as the torch backend (see its NOTE [Why a heap scan, only on the error path]), through the shared
:func:`gradguard.backends.adapter.name_by_memory`: match parameter/buffer memory of ``paddle.nn.Layer`` objects.
"""

from __future__ import annotations

import paddle

from ..adapter import name_by_memory
from ...core.internal import log_fallback

__all__ = ["name_tensor", "memory_range"]


def memory_range(t) -> tuple[int, int, int] | None:
    """(storage key, start, end): Paddle exposes no storage object, so one address space (key 0) with
    absolute byte addresses. Views (slices, reshapes) fall inside their base's range."""
    try:
        ptr = t.data_ptr()
        n = int(t.size) * t.element_size()
    except Exception as error:
        log_fallback("backends.paddle", "reading data_ptr/size", error)
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
    return name_by_memory(paddle.nn.Layer, lambda layer: layer.children(), _named_tensors,
                          lambda value: value.data_ptr() == ptr)


def _named_tensors(layer):
    for name, value in layer.named_parameters():
        yield "parameter", name, value
    for name, value in layer.named_buffers():
        yield "buffer", name, value
