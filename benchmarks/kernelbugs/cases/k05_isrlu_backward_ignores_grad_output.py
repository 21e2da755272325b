"""ISRLU activation posted to PyTorch's tracker: the backward returns the local derivative, not grad_out times it.

Report: https://github.com/pytorch/pytorch/issues/4355 ("gradcheck fails with cryptic error": a user's ISRLU
Function whose ``backward`` returns ``ctx.nisr ** 3``). Fix: the answer on that issue, multiply by the
upstream gradient (``grad_out * ctx.nisr ** 3``).
Code:   the issue's Function, verbatim apart from the Variable wrappers of torch 0.3.
"""

import torch
from torch.autograd import Function

CASE = {
    "library": "user op (pytorch#4355)",
    "kind": "backward",
    "report": "https://github.com/pytorch/pytorch/issues/4355",
    "fix": "https://github.com/pytorch/pytorch/issues/4355 (the answer on the issue)",
    "code": "verbatim from the issue",
    "root_cause": ("gradient.numerical", "gradient.reference", "gradient.cotangent_linearity"),
    "without_reference": "caught",
    "known_defects": (),
}


class ISRLU(Function):
    @staticmethod
    def forward(ctx, tensor, alpha=1):
        negatives = torch.min(tensor, 0 * tensor)
        ctx.nisr = torch.rsqrt(1. + alpha * (negatives ** 2))
        # ctx.nisr == 1 where tensor elements are positive
        return tensor * ctx.nisr

    @staticmethod
    def backward(ctx, grad_out):
        return ctx.nisr ** 3, None


class ISRLUFixed(ISRLU):
    @staticmethod
    def backward(ctx, grad_out):
        return grad_out * ctx.nisr ** 3, None


def buggy(x):
    return ISRLU.apply(x)


def fixed(x):
    return ISRLUFixed.apply(x)


def reference(x):
    negatives = torch.clamp(x, max=0)
    return x * torch.rsqrt(1.0 + negatives ** 2)


def inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(20, 20, dtype=torch.float64, generator=g),)


OPTIONS = {}
