"""entmax's sparsemax: the backward squeezes every size-1 dimension, not only ``dim``.

Report: https://github.com/deep-spin/entmax/issues/13 ("Unexpected behaviour of sparsemax gradients for 3d
tensors": gradients differ between a (2, 3) input and the same values shaped (2, 1, 3)).
Fix:    https://github.com/deep-spin/entmax/pull/18 (commit 4f3bc08, "if the input to the sparsemax has
dimensions with size=1, they are squeezed by accident"): ``.squeeze()`` -> ``.squeeze(dim)``.
Code:   entmax/activations.py at 4f3bc08^ (MIT, Ben Peters, Vlad Niculae): SparsemaxFunction and the threshold
helper, full sort path (k=None), unchanged apart from the ``FIXED`` switch.
"""

import torch
from torch.autograd import Function

CASE = {
    "library": "entmax 1.0",
    "kind": "backward",
    "report": "https://github.com/deep-spin/entmax/issues/13",
    "fix": "https://github.com/deep-spin/entmax/pull/18",
    "code": "verbatim (entmax/activations.py at 4f3bc08^)",
    # the author's own test input has no size-1 dimension: the bug must come from a regime
    "root_cause": ("regime.singleton_dim",),
    "without_reference": "caught",
    "known_defects": (),
}


def _make_ix_like(X, dim):
    d = X.size(dim)
    rho = torch.arange(1, d + 1, device=X.device, dtype=X.dtype)
    view = [1] * X.dim()
    view[0] = -1
    return rho.view(view).transpose(0, dim)


def _sparsemax_threshold_and_support(X, dim=-1):
    topk, _ = torch.sort(X, dim=dim, descending=True)
    topk_cumsum = topk.cumsum(dim) - 1
    rhos = _make_ix_like(topk, dim)
    support = rhos * topk > topk_cumsum
    support_size = support.sum(dim=dim).unsqueeze(dim)
    tau = topk_cumsum.gather(dim, support_size - 1)
    tau /= support_size.to(X.dtype)
    return tau, support_size


def _sparsemax_function(fixed):
    class SparsemaxFunction(Function):
        @classmethod
        def forward(cls, ctx, X, dim=-1, k=None):
            ctx.dim = dim
            max_val, _ = X.max(dim=dim, keepdim=True)
            X = X - max_val  # same numerical stability trick as softmax
            tau, supp_size = _sparsemax_threshold_and_support(X, dim=dim)
            output = torch.clamp(X - tau, min=0)
            ctx.save_for_backward(supp_size, output)
            return output

        @classmethod
        def backward(cls, ctx, grad_output):
            supp_size, output = ctx.saved_tensors
            dim = ctx.dim
            grad_input = grad_output.clone()
            grad_input[output == 0] = 0
            if fixed:
                v_hat = grad_input.sum(dim=dim) / supp_size.to(output.dtype).squeeze(dim)
            else:
                v_hat = grad_input.sum(dim=dim) / supp_size.to(output.dtype).squeeze()
            v_hat = v_hat.unsqueeze(dim)
            grad_input = torch.where(output != 0, grad_input - v_hat, grad_input)
            return grad_input, None, None

    return SparsemaxFunction


_Buggy, _Fixed = _sparsemax_function(False), _sparsemax_function(True)


def buggy(X):
    return _Buggy.apply(X, -1)


def fixed(X):
    return _Fixed.apply(X, -1)


def reference(X):
    """Sparsemax by autograd through sort/gather (no hand-written backward)."""
    X = X - X.max(dim=-1, keepdim=True).values
    tau, _ = _sparsemax_threshold_and_support(X, dim=-1)
    return torch.clamp(X - tau, min=0)


def inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(4, 6, dtype=torch.float64, generator=g),)


OPTIONS = {}
