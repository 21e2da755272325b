"""FlagGems layer_norm backward: with several rows per program, the row sums run over the whole block.

Report/fix: https://github.com/flagos-ai/FlagGems/pull/59 ("layer_norm_backward_kernel does not work correctly with
BLOCK_ROW_SIZE > 1"; commits 3dd5b06 and 209dbc4): ``tl.sum(dx_part2)`` reduces over every row of the block
instead of ``axis=1``, the mask ignores the row bound, and the grid launches one program per row although each
program covers BLOCK_ROW_SIZE rows.
Code:   src/flag_gems/ops/layernorm.py at 3dd5b06^ (buggy) and 209dbc4 (fixed), Apache-2.0, verbatim kernels.
Changes for CPU: ``libentry``/``autotune`` removed, the autotuner's choice pinned to BLOCK_ROW_SIZE=4 (its
configs are 1, 2, 4, 8 rows; on a GPU it picks by speed) and BLOCK_COL_SIZE=16 (2048 on a GPU); ``row_mask and
col_mask`` written ``row_mask & col_mask`` (what Triton's compiler makes of ``and`` on tensors; the interpreter
would take Python's truth value and drop the row bound).

Memory (checked by hand, with every interpreter load/store checked against the launch's tensor arguments):
- Both backward kernels load ``Mean``/``Rstd`` without a mask (upstream, both versions): the rows past ``M`` of
  the last block are read out of bounds (reads only: no store leaves its buffer on any shape check_op tries).
  The buggy version launches ``M`` programs of BLOCK_ROW_SIZE rows, so most of its rows are out of bounds, and
  its ``tl.where(col_mask, ...)`` keeps the garbage in ``x_hat`` of the masked rows; ``tl.sum(dx_part3)`` over
  the whole block then adds ``0 * garbage``, which is NaN when the garbage is inf or NaN. So the buggy gradient
  is now and then non-finite, at random (0 to 11 in 30 one-row calls per process here): part of the published
  bug (the fix's ``tl.where(mask, ...)`` and per-row sums keep the garbage out), left as it is.
- ``buggy``/``fixed`` check that weight and bias have the normalized shape, as torch's own layer_norm does,
  before any kernel runs. Upstream does not check (its callers pass a module's parameters); given a weight
  shorter than N, ``weight_bias_backward_kernel`` stores N values into weight-sized ``dW``/``dB``, and under
  TRITON_INTERPRET=1 that corrupts the heap (glibc aborts: ``malloc(): unaligned tcache chunk``, ``double free
  or corruption``). check_op's shrink produced such inputs: when the batch_size regime's x (1, 12) fails in
  a new way (without the reference: the random NaN above in float32 only, ``gradient.precision``), the shrink
  cuts the first input whose leading size is above 1, the weight, to x (1, 12), weight (1,), bias (1,).
  With the check, that candidate raises and the shrink skips it.
"""

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

CASE = {
    "library": "FlagGems (June 2024)",
    "kind": "backward (Triton)",
    "report": "https://github.com/flagos-ai/FlagGems/pull/59",
    "fix": "https://github.com/flagos-ai/FlagGems/commit/209dbc4ac",
    "code": "verbatim kernels at 3dd5b06^ and 209dbc4, autotune pinned",
    "root_cause": ("gradient.numerical", "gradient.reference", "op.raised"),
    "without_reference": "caught",
    "known_defects": (),
}

ROWS, COLS = 4, 16


@triton.jit
def layer_norm_kernel(X, Y, W, B, Mean, Rstd, M, N, eps, BLOCK_ROW_SIZE: tl.constexpr, BLOCK_COL_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    row = pid * BLOCK_ROW_SIZE + tl.arange(0, BLOCK_ROW_SIZE)[:, None]
    row_mask = row < M
    X += row * N
    Y += row * N
    _mean = tl.zeros([BLOCK_ROW_SIZE, BLOCK_COL_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_COL_SIZE):
        cols = off + tl.arange(0, BLOCK_COL_SIZE)[None, :]
        col_mask = cols < N
        mask = row_mask & col_mask
        a = tl.load(X + cols, mask, other=0.0).to(tl.float32)
        _mean += a
    mean = tl.sum(_mean, axis=1) / N
    mean = mean[:, None]
    _var = tl.zeros([BLOCK_ROW_SIZE, BLOCK_COL_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_COL_SIZE):
        cols = off + tl.arange(0, BLOCK_COL_SIZE)[None, :]
        col_mask = cols < N
        mask = row_mask & col_mask
        x = tl.load(X + cols, mask, other=0.0).to(tl.float32)
        x = tl.where(col_mask, x - mean, 0.0)
        _var += x * x
    var = tl.sum(_var, axis=1) / N
    var = var[:, None]
    rstd = 1 / tl.sqrt(var + eps)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    for off in range(0, N, BLOCK_COL_SIZE):
        cols = off + tl.arange(0, BLOCK_COL_SIZE)[None, :]
        col_mask = cols < N
        mask = row_mask & col_mask
        w = tl.load(W + cols, col_mask)
        b = tl.load(B + cols, col_mask)
        x = tl.load(X + cols, mask, other=0.0).to(tl.float32)
        x = tl.where(col_mask, x - mean, 0.0)
        x_hat = x * rstd
        y = x_hat * w + b
        tl.store(Y + cols, y, mask=mask)


@triton.jit
def layer_norm_backward_kernel_buggy(dY, X, W, Mean, Rstd, dX, M, N, BLOCK_ROW_SIZE: tl.constexpr, BLOCK_COL_SIZE: tl.constexpr):
    pid = tl.program_id(0) * BLOCK_ROW_SIZE + tl.arange(0, BLOCK_ROW_SIZE)[:, None]
    row_mask = pid < M
    dY += pid * N
    X += pid * N
    dX += pid * N
    Mean += pid
    Rstd += pid
    mean = tl.load(Mean).to(tl.float32)
    rstd = tl.load(Rstd).to(tl.float32)
    dx_part2 = tl.zeros([BLOCK_ROW_SIZE, BLOCK_COL_SIZE], dtype=tl.float32)
    dx_part3 = tl.zeros([BLOCK_ROW_SIZE, BLOCK_COL_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_COL_SIZE):
        cols = off + tl.arange(0, BLOCK_COL_SIZE)
        col_mask = cols[None, :] < N
        mask = row_mask & col_mask
        dy = tl.load(dY + cols[None, :], mask).to(tl.float32)
        x = tl.load(X + cols[None, :], mask).to(tl.float32)
        x = tl.where(col_mask, x - mean, 0.0)
        x_hat = x * rstd
        w = tl.load(W + cols, mask=cols < N).to(tl.float32)
        dx_hat = dy * w
        dx_part2 += dx_hat
        dx_part3 += dx_hat * x_hat
    dx_2 = tl.sum(dx_part2)
    dx_3 = tl.sum(dx_part3)
    for off in range(0, N, BLOCK_COL_SIZE):
        cols = off + tl.arange(0, BLOCK_COL_SIZE)
        col_mask = cols[None, :] < N
        mask = row_mask & col_mask
        dy = tl.load(dY + cols[None, :], mask).to(tl.float32)
        x = tl.load(X + cols[None, :], mask).to(tl.float32)
        w = tl.load(W + cols, mask=cols < N).to(tl.float32)
        x = tl.where(col_mask, x - mean, 0.0)
        x_hat = x * rstd
        dx_hat = dy * w
        dx = rstd * (dx_hat - (dx_2 + x_hat * dx_3) / N)
        tl.store(dX + cols, dx, mask=mask)


@triton.jit
def layer_norm_backward_kernel_fixed(dY, X, W, Mean, Rstd, dX, M, N, BLOCK_ROW_SIZE: tl.constexpr, BLOCK_COL_SIZE: tl.constexpr):
    pid = tl.program_id(0) * BLOCK_ROW_SIZE + tl.arange(0, BLOCK_ROW_SIZE)[:, None]
    row_mask = pid < M
    dY += pid * N
    X += pid * N
    dX += pid * N
    Mean += pid
    Rstd += pid
    mean = tl.load(Mean).to(tl.float32)
    rstd = tl.load(Rstd).to(tl.float32)
    dx_part2 = tl.zeros([BLOCK_ROW_SIZE, BLOCK_COL_SIZE], dtype=tl.float32)
    dx_part3 = tl.zeros([BLOCK_ROW_SIZE, BLOCK_COL_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_COL_SIZE):
        cols = off + tl.arange(0, BLOCK_COL_SIZE)
        col_mask = cols[None, :] < N
        mask = row_mask & col_mask
        dy = tl.load(dY + cols[None, :], mask).to(tl.float32)
        x = tl.load(X + cols[None, :], mask).to(tl.float32)
        x = tl.where(mask, x - mean, 0.0)
        x_hat = x * rstd
        w = tl.load(W + cols, mask=cols < N).to(tl.float32)
        dx_hat = dy * w
        dx_part2 += dx_hat
        dx_part3 += dx_hat * x_hat
    dx_2 = tl.sum(dx_part2, axis=1)[:, None]
    dx_3 = tl.sum(dx_part3, axis=1)[:, None]
    for off in range(0, N, BLOCK_COL_SIZE):
        cols = off + tl.arange(0, BLOCK_COL_SIZE)
        col_mask = cols[None, :] < N
        mask = row_mask & col_mask
        dy = tl.load(dY + cols[None, :], mask).to(tl.float32)
        x = tl.load(X + cols[None, :], mask).to(tl.float32)
        w = tl.load(W + cols, mask=cols < N).to(tl.float32)
        x = tl.where(mask, x - mean, 0.0)
        x_hat = x * rstd
        dx_hat = dy * w
        dx = rstd * (dx_hat - (dx_2 + x_hat * dx_3) / N)
        tl.store(dX + cols, dx, mask=mask)


@triton.jit
def weight_bias_backward_kernel(dY, X, Mean, Rstd, dW, dB, M, N, BLOCK_ROW_SIZE: tl.constexpr, BLOCK_COL_SIZE: tl.constexpr):
    pid = tl.program_id(0) * BLOCK_COL_SIZE + tl.arange(0, BLOCK_COL_SIZE)[None, :]
    col_mask = pid < N
    dY += pid
    X += pid
    dW += pid
    dB += pid
    accW = tl.zeros([BLOCK_ROW_SIZE, BLOCK_COL_SIZE], dtype=tl.float32)
    accB = tl.zeros([BLOCK_ROW_SIZE, BLOCK_COL_SIZE], dtype=tl.float32)
    for off in range(0, M, BLOCK_ROW_SIZE):
        rows = off + tl.arange(0, BLOCK_ROW_SIZE)
        row_mask = rows[:, None] < M
        mask = row_mask & col_mask
        dy = tl.load(dY + rows[:, None] * N, mask).to(tl.float32)
        x = tl.load(X + rows[:, None] * N, mask).to(tl.float32)
        mean = tl.load(Mean + rows, mask=rows < M)[:, None].to(tl.float32)
        rstd = tl.load(Rstd + rows, mask=rows < M)[:, None].to(tl.float32)
        x = tl.where(col_mask, x - mean, 0.0)
        x_hat = x * rstd
        accW += dy * x_hat
        accB += dy
    dw = tl.sum(accW, axis=0)
    db = tl.sum(accB, axis=0)
    tl.store(dW, dw[None, :], mask=col_mask)
    tl.store(dB, db[None, :], mask=col_mask)


def _layer_norm_function(fixed):
    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, normalized_shape, weight, bias, eps=1e-5, cudnn_enable=True):
            dim = x.ndim - len(normalized_shape)
            M = math.prod(x.shape[:dim])
            N = math.prod(normalized_shape)
            x = x.contiguous()
            weight = weight.contiguous()
            bias = bias.contiguous()
            y = torch.empty_like(x)
            mean = torch.empty(M, dtype=x.dtype, device=x.device)
            rstd = torch.empty(M, dtype=x.dtype, device=x.device)
            grid = (triton.cdiv(M, 1),)
            layer_norm_kernel[grid](x, y, weight, bias, mean, rstd, M, N, eps, BLOCK_ROW_SIZE=1, BLOCK_COL_SIZE=COLS)
            ctx.save_for_backward(x, weight, mean, rstd)
            ctx.M = M
            ctx.N = N
            return y

        @staticmethod
        def backward(ctx, out_grad):
            out_grad = out_grad.contiguous()
            (x, weight, mean, rstd) = ctx.saved_tensors
            M = ctx.M
            N = ctx.N
            in_grad = torch.empty_like(x)
            if fixed:
                grid = (triton.cdiv(M, ROWS), 1, 1)
                layer_norm_backward_kernel_fixed[grid](out_grad, x, weight, mean, rstd, in_grad, M, N, BLOCK_ROW_SIZE=ROWS, BLOCK_COL_SIZE=COLS)
            else:
                grid = (M, 1, 1)
                layer_norm_backward_kernel_buggy[grid](out_grad, x, weight, mean, rstd, in_grad, M, N, BLOCK_ROW_SIZE=ROWS, BLOCK_COL_SIZE=COLS)
            grid = (triton.cdiv(N, 4), 1, 1)
            weight_grad = torch.empty_like(weight)
            bias_grad = torch.empty_like(weight)
            weight_bias_backward_kernel[grid](out_grad, x, mean, rstd, weight_grad, bias_grad, M, N, BLOCK_ROW_SIZE=COLS, BLOCK_COL_SIZE=4)
            return in_grad, None, weight_grad, bias_grad, None, None

    return LayerNorm


_Buggy, _Fixed = _layer_norm_function(False), _layer_norm_function(True)


def _check_shapes(x, weight, bias):
    """torch's layer_norm contract (its message): the kernels index weight and bias by the last dimension of x."""
    for name, t in (("weight", weight), ("bias", bias)):
        if tuple(t.shape) != (x.shape[-1],):
            raise RuntimeError(f"Expected {name} to be of same shape as normalized_shape, but got {name} of shape "
                               f"{list(t.shape)} and normalized_shape = {[x.shape[-1]]}")


def buggy(x, weight, bias):
    _check_shapes(x, weight, bias)
    return _Buggy.apply(x, (x.shape[-1],), weight, bias)


def fixed(x, weight, bias):
    _check_shapes(x, weight, bias)
    return _Fixed.apply(x, (x.shape[-1],), weight, bias)


def reference(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias)


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 12, generator=g), 1 + 0.1 * torch.randn(12, generator=g), 0.1 * torch.randn(12, generator=g)


OPTIONS = {}
