"""The MindSpore adapter (PyNative by default; ``check_op`` also runs graph mode), and the explanation of MindSpore's
own in-place error (its ``eager.py``, NOTE [One folder per framework])."""

from __future__ import annotations

import re

import numpy as np
import mindspore as ms

from ..adapter import AdapterBase
from ..._errors import InplaceModificationError
from ...core.diagnosis import diagnose
from ...core.facts import Facts
from ...core.findings import Finding, SaveSite, TensorInfo
from ...core.internal import log_fallback
from .check import check_op
from .session import MindSporeGuardSession, current_mode, memory_range, mindspore_fix

__all__ = ["MindSporeAdapter", "ADAPTER", "memory_range", "current_mode", "enrich_mindspore_error"]

_VERSION = re.compile(r"One of the Tensor needed for gradient computation has been modified by an inplace operation, "
                      r"which is the (\d+) 's (input|output|custom saved tensor) of (\w+); and its version is (\d+) , "
                      r"expected version (\d+)")


def enrich_mindspore_error(error, session=None):
    """MindSpore's own version-check error (raised when hooks did not see the save) with a diagnosis."""
    match = _VERSION.search(str(error))
    if match is None or not isinstance(error, RuntimeError):
        return None
    index, what, op, now, expected = match.groups()
    finding = Finding(
        kind="inplace_modification", tensor=TensorInfo(shape=(), dtype="?", role="tensor"),
        saved_at=SaveSite(node=op, argument=f"{what}[{index}]"), versions={"saved": int(expected), "now": int(now)},
        backend="mindspore", facts=Facts(mode=current_mode(), mindspore_message=str(error).split("\n")[0]),
    )
    diagnose(finding)
    return InplaceModificationError(mindspore_fix(finding))


class MindSporeAdapter(AdapterBase):
    name = "mindspore"
    module_name = "mindspore"
    tensor_type = ms.Tensor

    def version(self, t):
        try:
            return int(t._version)
        except Exception as error:
            log_fallback("backends.mindspore", "reading the version counter", error)
            return None

    mode = staticmethod(current_mode)
    saved_tensors_hooks = staticmethod(ms.saved_tensors_hooks)
    memory_range = staticmethod(memory_range)
    dtype_name = staticmethod(MindSporeGuardSession.dtype_name)
    to_numpy = staticmethod(MindSporeGuardSession.to_numpy)

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
