"""Liger-Kernel cross entropy, reduction="none": the backward scales every row by grad_output[0].

Report: https://github.com/linkedin/Liger-Kernel/issues/678 ("LigerCrossEntropyLoss(reduction='none') cause
grad_norm=0"): with a per-token loss, backward receives one upstream gradient per row, but
``element_mul_kernel`` loads ``grad_output`` as a scalar (``tl.load(grad_output_ptr)``).
Fix:    https://github.com/linkedin/Liger-Kernel/pull/680 ("grad_output is not just a scalar and it should be
multiplied to each row respectively"): ``elif grad_output.ndim > 0: _input = _input * grad_output.unsqueeze(1)``.
Code:   the installed liger-kernel's own forward and Triton kernels (run under TRITON_INTERPRET=1); the buggy
backward is the installed ``cross_entropy_backward`` without the ``ndim > 0`` branch, as it was before the fix.
"""

import torch
import torch.nn.functional as F
import triton
from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction, cross_entropy_backward
from liger_kernel.ops.utils import element_mul_kernel

CASE = {
    "library": "liger-kernel 0.5",
    "kind": "backward (Triton)",
    "report": "https://github.com/linkedin/Liger-Kernel/issues/678",
    "fix": "https://github.com/linkedin/Liger-Kernel/pull/680",
    "code": "installed liger-kernel kernels; the backward as before the fix",
    "root_cause": ("gradient.numerical", "gradient.reference", "gradient.cotangent_linearity"),
    "without_reference": "caught",
    # Both versions write the gradient into the logits they were given (seed 002; Liger-Kernel PR #262's
    # "in-place correctness checks"), which breaks a second backward and any op upstream that saved them.
    # Both also return a wrong gradient for column-strided logits (the gradient is written with unit column
    # stride): found by check_op's noncontiguous regime, checked by hand, no public report found.
    "known_defects": ("mutation.silent_input_write", "mutation.backward_not_repeatable", "composition.", "regime.noncontiguous"),
}


def _backward_before_the_fix(_input, grad_output):
    if torch.equal(grad_output, torch.tensor(1.0, device=grad_output.device)):
        return _input
    BT, V = _input.shape
    element_mul_kernel[(BT,)](_input, _input.stride(-2), grad_output, V, BLOCK_SIZE=triton.next_power_of_2(V), num_warps=32)
    return _input


class _BeforeTheFix(LigerCrossEntropyFunction):
    @staticmethod
    def backward(ctx, grad_output, *unused):
        (_input,) = ctx.saved_tensors
        return (_backward_before_the_fix(_input, grad_output),) + (None,) * 10


class _AfterTheFix(LigerCrossEntropyFunction):
    @staticmethod
    def backward(ctx, grad_output, *unused):
        (_input,) = ctx.saved_tensors
        return (cross_entropy_backward(_input, grad_output),) + (None,) * 10


def _call(function, logits, target):
    return function.apply(logits, target, None, -100, 0.0, 0.0, "none", None, False, False, False)[0]


def buggy(logits, target):
    return _call(_BeforeTheFix, logits, target)


def fixed(logits, target):
    return _call(_AfterTheFix, logits, target)


def reference(logits, target):
    return F.cross_entropy(logits, target, reduction="none")


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=g), torch.randint(0, 16, (8,), generator=g)


OPTIONS = {}
