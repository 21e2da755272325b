"""A minimal Triton kernel that stores d(sum x^2)/dx into its input x, after exp() saved x for backward.

    python examples/silent/triton_kernel_writes_input.py             # CPU: runs Triton's interpreter
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # @triton.jit reads it when the kernel is decorated

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import gradguard  # noqa: E402


@triton.jit
def square_sum_grad_into_input(x_ptr, loss_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    tl.atomic_add(loss_ptr, tl.sum(x * x, axis=0))
    tl.store(x_ptr + offsets, 2.0 * x, mask=mask)  # the gradient, stored into the input


class SquareSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, declare=False):
        loss = torch.zeros((), device=x.device)
        square_sum_grad_into_input[(triton.cdiv(x.numel(), 64),)](x, loss, x.numel(), BLOCK=64)
        if declare:
            torch.autograd.graph.increment_version(x)  # the kernel-author fix: the write becomes visible
        ctx.save_for_backward(x.detach())
        return loss

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return grad * g, None


device = "cuda" if torch.cuda.is_available() else "cpu"
a = torch.randn(8, 8, device=device, requires_grad=True)

print("== SquareSum(exp(a)): the kernel overwrites exp's saved output ==")
try:
    with gradguard.guard():
        SquareSum.apply(torch.exp(a)).backward()
except gradguard.SilentModificationError as error:
    print(error)

print("\n== with increment_version inside forward: PyTorch's own (loud) check now fires ==")
try:
    with gradguard.guard():
        SquareSum.apply(torch.exp(a), True).backward()
except gradguard.InplaceModificationError as error:
    print(error.finding.headline)
