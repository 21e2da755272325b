"""The PaddlePaddle adapter (dygraph / eager mode)."""

from __future__ import annotations

import numpy as np
import paddle

from ..adapter import AdapterBase
from .check import check_op
from .eager import enrich_paddle_error
from .session import PaddleGuardSession, memory_range, name_tensor
from ...core.internal import log_fallback

__all__ = ["PaddleAdapter", "ADAPTER"]


class PaddleAdapter(AdapterBase):
    name = "paddle"
    module_name = "paddle"
    tensor_type = paddle.Tensor

    def mode(self) -> str:
        return "eager" if paddle.in_dynamic_mode() else "static"

    def version(self, t) -> int | None:
        try:
            return int(t.inplace_version)
        except Exception as error:
            log_fallback("backends.paddle", "reading inplace_version", error)
            return None

    saved_tensors_hooks = staticmethod(paddle.autograd.saved_tensors_hooks)
    no_grad = staticmethod(paddle.no_grad)
    memory_range = staticmethod(memory_range)
    name_tensor = staticmethod(name_tensor)
    dtype_name = staticmethod(PaddleGuardSession.dtype_name)

    def to_numpy(self, t):
        return np.asarray(t.detach().numpy() if not t.stop_gradient else t.numpy())

    def from_numpy(self, a, *, requires_grad: bool = True):
        return paddle.to_tensor(np.array(a, copy=True), stop_gradient=not requires_grad)

    def vjp(self, fn, inputs, cotangents):
        outputs = fn(*inputs)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        terms = [(o * paddle.to_tensor(c, dtype=o.dtype)).sum() for o, c in zip(outputs, cotangents)
                 if isinstance(o, paddle.Tensor) and not o.stop_gradient]
        if not terms:
            return [None] * len(inputs)
        grads = paddle.grad([sum(terms[1:], terms[0])], list(inputs), allow_unused=True)
        return [None if g is None else g.numpy() for g in grads]

    def new_guard_session(self, *, fingerprint: str, track_writes: bool, bisect: bool = False):
        return PaddleGuardSession(fingerprint=fingerprint, track_writes=track_writes, bisect=bisect)

    check_op = staticmethod(check_op)
    enrich_error = staticmethod(enrich_paddle_error)

    def advise(self, fn, args, kwargs, **options):  # capability "advise": Paddle's own advisor pipeline
        from .advisor import advise_paddle

        return advise_paddle(fn, args, kwargs, **options)


ADAPTER = PaddleAdapter()
