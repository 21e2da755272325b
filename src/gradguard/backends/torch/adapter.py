"""The PyTorch adapter: a thin wrapper over the existing torch backend functions."""

from __future__ import annotations

import torch

from ..adapter import AdapterBase
from .coverage import install_coverage_probe
from .fingerprint import byte_range, fingerprint
from .attribution import tensor_version
from .graph import name_tensor

__all__ = ["TorchAdapter", "ADAPTER"]


class TorchAdapter(AdapterBase):
    name = "torch"
    module_name = "torch"
    tensor_type = torch.Tensor
    version = staticmethod(tensor_version)  # None for inference tensors
    fingerprint = staticmethod(fingerprint)  # "full" by default
    saved_tensors_hooks = staticmethod(torch.autograd.graph.saved_tensors_hooks)
    name_tensor = staticmethod(name_tensor)
    memory_range = staticmethod(byte_range)
    no_grad = staticmethod(torch.no_grad)
    install_coverage_probe = staticmethod(install_coverage_probe)  # capability "coverage" (`gradguard fix`)

    def to_numpy(self, t):
        return t.detach().cpu().numpy()

    def from_numpy(self, a, *, requires_grad: bool = True):
        return torch.from_numpy(a.copy()).requires_grad_(requires_grad)

    def vjp(self, fn, inputs, cotangents):
        outputs = fn(*inputs)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        pairs = [(o, c) for o, c in zip(outputs, cotangents) if isinstance(o, torch.Tensor) and o.requires_grad]
        grads = torch.autograd.grad([o for o, _ in pairs], list(inputs), [c for _, c in pairs], allow_unused=True)
        return [None if g is None else g.detach().numpy() for g in grads]

    def new_guard_session(self, *, fingerprint: str, track_writes: bool, bisect: bool = False):
        from .session import TorchGuardSession

        return TorchGuardSession(fingerprint=fingerprint, track_writes=track_writes, bisect=bisect)

    def check_op(self, fn, *inputs, reference=None, **options):
        from ...checks.audit import run_check_op
        from ...checks.torch_ops import TORCH

        return run_check_op(TORCH, fn, inputs, reference, options)

    def enrich_error(self, error, session=None):
        from .eager import enrich_eager_error

        return enrich_eager_error(error, session)


ADAPTER = TorchAdapter()
