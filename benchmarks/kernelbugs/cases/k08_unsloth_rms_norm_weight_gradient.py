"""Unsloth's fast RMS LayerNorm: the backward returns no gradient for the weight (frozen norms in full finetuning).

Report: https://github.com/unslothai/unsloth/issues/4533 ("`fast_rms_layernorm` does not compute weight gradients
- RMSNorm weights never update during full finetuning": ``Fast_RMS_Layernorm.backward`` returns ``dX, None,
None, None``; the dW code is commented out).
Fix:    the report's: the weight gradient sum over rows of dY * X * rstd (computed here in PyTorch after the
kernel; upstream's dW kernel argument is still commented out).
Code:   unsloth/kernels/rms_layernorm.py at 17795e4 (Apache-2.0), Triton kernels and Function verbatim;
``calculate_settings`` and ``torch_gpu_device`` inlined for CPU.
"""

import contextlib

import torch
import triton
import triton.language as tl

CASE = {
    "library": "unsloth 2026.3",
    "kind": "backward (Triton)",
    "report": "https://github.com/unslothai/unsloth/issues/4533",
    "fix": "https://github.com/unslothai/unsloth/issues/4533 (the fix it proposes)",
    "code": "verbatim at 17795e4 (Triton), helpers inlined",
    "root_cause": ("gradient.numerical", "gradient.reference"),
    "without_reference": "caught",
    # Both versions store dX over dY (``dX = dY`` when not Gemma): the pattern of NVIDIA/apex#1430. Both read
    # columns with unit stride, so a column-strided input gives another forward (max diff 4.4 on these inputs):
    # found by check_op's noncontiguous regime, checked by hand, no public report found.
    "known_defects": ("mutation.grad_output_write", "regime.noncontiguous"),
}


def calculate_settings(n):
    return triton.next_power_of_2(n), 4


torch_gpu_device = lambda device: contextlib.nullcontext()  # noqa: E731


@triton.jit
def _rms_layernorm_forward(Y, Y_row_stride: tl.constexpr, X, X_row_stride: tl.constexpr, W, W_row_stride: tl.constexpr,
                           r, r_row_stride: tl.constexpr, n_cols: tl.constexpr, eps: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols

    Y += row_idx * Y_row_stride
    X += row_idx * X_row_stride
    r += row_idx * r_row_stride

    X_row = tl.load(X + col_offsets, mask = mask, other = 0).to(tl.float32)
    W_row = tl.load(W + col_offsets, mask = mask, other = 0)  # .to(tl.float32)

    row_var = tl.sum(X_row * X_row, axis = 0) / n_cols
    eps_f32 = tl.full((), eps, tl.float32)
    inv_var = tl.math.rsqrt(row_var + eps_f32)
    tl.store(r, inv_var)
    normed = X_row * inv_var
    normed = normed.to(W_row.dtype)  # Exact copy from HF
    output = normed * W_row
    tl.store(Y + col_offsets, output, mask = mask)


@triton.jit
def _rms_layernorm_backward(dY, dY_row_stride: tl.constexpr, dX, dX_row_stride: tl.constexpr, X, X_row_stride: tl.constexpr,
                            W, W_row_stride: tl.constexpr, r, r_row_stride: tl.constexpr, n_cols: tl.constexpr,
                            eps: tl.constexpr, GEMMA: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols

    dY += row_idx * dY_row_stride
    X += row_idx * X_row_stride
    r += row_idx * r_row_stride

    if GEMMA:
        dX += row_idx * dY_row_stride
    else:
        dX = dY

    dY_row = tl.load(dY + col_offsets, mask = mask, other = 0).to(tl.float32)
    X_row = tl.load(X + col_offsets, mask = mask, other = 0).to(tl.float32)
    W_row = tl.load(W + col_offsets, mask = mask, other = 0).to(tl.float32)

    inv_var = tl.load(r).to(tl.float32)
    normed = X_row * inv_var

    if GEMMA:
        dY_W = dY_row * (W_row + 1.0)
    else:
        dY_W = dY_row * W_row

    rowsum_dY_normed = tl.sum(dY_W * normed, axis = 0)
    output = inv_var / n_cols * (n_cols * dY_W - normed * rowsum_dY_normed)
    tl.store(dX + col_offsets, output, mask = mask)


class Fast_RMS_Layernorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X: torch.Tensor, W: torch.Tensor, eps: float, gemma: bool = False):
        shape = X.shape
        dim: int = shape[-1]
        X = X.reshape(-1, dim)
        n_rows, n_cols = X.shape
        BLOCK_SIZE, num_warps = calculate_settings(n_cols)
        device = X.device

        Y = torch.empty((n_rows, n_cols), dtype = X.dtype, device = device)
        r = torch.empty(n_rows, dtype = torch.float32, device = device)

        with torch_gpu_device(device):
            _rms_layernorm_forward[(n_rows,)](Y, Y.stride(0), X, X.stride(0), W, W.stride(0), r, r.stride(0), n_cols, eps,
                                              BLOCK_SIZE = BLOCK_SIZE, num_warps = num_warps)
        ctx.eps = eps
        ctx.BLOCK_SIZE = BLOCK_SIZE
        ctx.num_warps = num_warps
        ctx.GEMMA = gemma
        ctx.save_for_backward(X, W, r)
        return Y.view(*shape)

    @staticmethod
    def backward(ctx, dY: torch.Tensor):
        shape = dY.shape
        dim: int = shape[-1]
        dY = dY.reshape(-1, dim)
        X, W, r = ctx.saved_tensors
        n_rows, n_cols = dY.shape
        # dW = X
        dX = torch.empty_like(dY) if ctx.GEMMA else dY

        with torch_gpu_device(dY.device):
            _rms_layernorm_backward[(n_rows,)](dY, dY.stride(0), dX, dX.stride(0), X, X.stride(0), W, W.stride(0), r, r.stride(0),
                                               # dW, dW.stride(0),
                                               n_cols, ctx.eps, GEMMA = ctx.GEMMA, BLOCK_SIZE = ctx.BLOCK_SIZE,
                                               num_warps = ctx.num_warps)
        dX = dX.view(*shape)
        return dX, None, None, None


class Fast_RMS_Layernorm_WithWeightGradient(Fast_RMS_Layernorm):
    @staticmethod
    def backward(ctx, dY: torch.Tensor):
        X, W, r = ctx.saved_tensors
        # the weight gradient, read before the kernel stores dX over dY
        dW = (dY.reshape(-1, dY.shape[-1]).float() * (X.float() * r[:, None])).sum(0).to(W.dtype)
        dX = Fast_RMS_Layernorm.backward(ctx, dY)[0]
        return dX, dW, None, None


def buggy(X, W):
    return Fast_RMS_Layernorm.apply(X, W, 1e-6, False)


def fixed(X, W):
    return Fast_RMS_Layernorm_WithWeightGradient.apply(X, W, 1e-6, False)


def reference(X, W):
    Xf = X.float()
    return (Xf * torch.rsqrt(Xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(W.dtype) * W


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, 24, generator=g), 1 + 0.1 * torch.randn(24, generator=g)


OPTIONS = {}
