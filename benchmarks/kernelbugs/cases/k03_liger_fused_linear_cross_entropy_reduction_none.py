"""Liger-Kernel fused linear cross entropy, reduction="none": weight and input gradients ignore per-token grad_output.

Report: https://github.com/linkedin/Liger-Kernel/issues/968 ("LigerFusedLinearCrossEntropyLoss(reduction='none')
results in wrong grad, even causes grad=0") and PR #1298's description: the gradients are computed in the
forward and summed over tokens, then ``element_mul_kernel`` multiplies them by ``grad_output[0]``.
Fix:    https://github.com/linkedin/Liger-Kernel/pull/1298 (reduction="none" defers the gradient to backward and
folds each token's upstream gradient into the logits gradient before projecting).
Code:   the installed liger-kernel (fixed version: its LigerFusedLinearCrossEntropyFunction); the buggy version
computes the gradients in the forward and scales them in the backward with the installed
``fused_linear_cross_entropy_backward``, which is what every reduction did before the fix.
"""

import torch
import torch.nn.functional as F
from liger_kernel.ops.fused_linear_cross_entropy import (
    LigerFusedLinearCrossEntropyFunction,
    fused_linear_cross_entropy_backward,
    fused_linear_cross_entropy_forward,
)

CASE = {
    "library": "liger-kernel 0.6",
    "kind": "backward (Triton)",
    "report": "https://github.com/linkedin/Liger-Kernel/issues/968",
    "fix": "https://github.com/linkedin/Liger-Kernel/pull/1298",
    "code": "installed liger-kernel kernels; gradients computed in the forward as before the fix",
    "root_cause": ("gradient.numerical", "gradient.reference", "gradient.cotangent_linearity"),
    "without_reference": "caught",
    "known_defects": (),
}


class _BeforeTheFix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, _input, weight, target):
        loss, _, _, _, grad_input, grad_weight, grad_bias = fused_linear_cross_entropy_forward(
            _input=_input, weight=weight, target=target, reduction="none")
        ctx.save_for_backward(grad_input.detach(), grad_weight.detach() if grad_weight is not None else None)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        grad_input, grad_weight = ctx.saved_tensors
        grad_input, grad_weight, _ = fused_linear_cross_entropy_backward(grad_output, grad_input, grad_weight, None)
        return grad_input, grad_weight, None


def buggy(_input, weight, target):
    return _BeforeTheFix.apply(_input, weight, target)


def fixed(_input, weight, target):
    return LigerFusedLinearCrossEntropyFunction.apply(_input, weight, target, None, None, -100, 0.0, 0.0, "none")[0]


def reference(_input, weight, target):
    return F.cross_entropy(_input @ weight.t(), target, reduction="none")


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 12, generator=g), torch.randn(16, 12, generator=g) * 0.3, torch.randint(0, 16, (8,), generator=g)


OPTIONS = {}
