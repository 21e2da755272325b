"""A minimal Triton kernel of gradguard's own that stores its gradient into its input (like Liger's CE).

Imported only after TRITON_INTERPRET=1 is set (tests/conftest.py), so it runs on CPU under the interpreter.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def square_sum_grad_into_input(x_ptr, loss_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    tl.atomic_add(loss_ptr, tl.sum(x * x, axis=0))
    tl.store(x_ptr + offsets, 2.0 * x, mask=mask)  # d(sum x^2)/dx, stored into the input


@triton.jit
def square_sum_grad_out_of_place(x_ptr, grad_ptr, loss_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    tl.atomic_add(loss_ptr, tl.sum(x * x, axis=0))
    tl.store(grad_ptr + offsets, 2.0 * x, mask=mask)


class SquareSum(torch.autograd.Function):
    """sum(x**2) with the gradient computed in forward. mode: inplace | increment_version | out_of_place."""

    @staticmethod
    def forward(ctx, x, mode="inplace"):
        x = x.contiguous()
        loss = torch.zeros((), device=x.device, dtype=torch.float32)
        grid = (triton.cdiv(x.numel(), 64),)
        if mode == "out_of_place":
            grad = torch.empty_like(x)
            square_sum_grad_out_of_place[grid](x, grad, loss, x.numel(), BLOCK=64)
        else:
            square_sum_grad_into_input[grid](x, loss, x.numel(), BLOCK=64)
            if mode == "increment_version":
                torch.autograd.graph.increment_version(x)
            grad = x
        ctx.save_for_backward(grad.detach())
        return loss

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return grad * g, None
