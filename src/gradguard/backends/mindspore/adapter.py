"""The MindSpore adapter (PyNative by default; ``check_op`` also runs graph mode)."""

from __future__ import annotations

import numpy as np
import mindspore as ms

from ..adapter import AdapterBase
from ...core.internal import log_fallback
from .check import check_op
from .naming import current_mode, memory_range
from .eager import enrich_mindspore_error
from .session import MindSporeGuardSession

__all__ = ["MindSporeAdapter", "ADAPTER", "memory_range", "current_mode"]


class MindSporeAdapter(AdapterBase):
    name = "mindspore"
    module_name = "mindspore"

    def is_tensor(self, obj) -> bool:
        return isinstance(obj, ms.Tensor)

    def mode(self) -> str:
        return current_mode()

    def version(self, t):
        try:
            return int(t._version)
        except Exception as error:
            log_fallback("backends.mindspore", "reading the version counter", error)
            return None

    def saved_tensors_hooks(self, pack, unpack):
        return ms.saved_tensors_hooks(pack, unpack)

    memory_range = staticmethod(memory_range)

    def dtype_name(self, t) -> str:
        return str(t.dtype).lower()

    def to_numpy(self, t):
        return t.asnumpy()

    def from_numpy(self, a, *, requires_grad: bool = True):
        return ms.Tensor(np.array(a, copy=True), ms.float64 if np.asarray(a).dtype == np.float64 else None)

    def vjp(self, fn, inputs, cotangents):
        _out, vjp_fn = ms.vjp(fn, *inputs)
        cots = tuple(ms.Tensor(c, ms.float64) for c in cotangents)
        grads = vjp_fn(cots[0] if len(cots) == 1 else cots)
        grads = grads if isinstance(grads, (tuple, list)) else (grads,)
        return [None if g is None else g.asnumpy() for g in grads]

    def new_guard_session(self, *, fingerprint: str, track_writes: bool, bisect: bool = False):
        return MindSporeGuardSession(fingerprint=fingerprint, track_writes=track_writes, bisect=bisect)

    check_op = staticmethod(check_op)
    enrich_error = staticmethod(enrich_mindspore_error)


ADAPTER = MindSporeAdapter()
