"""Hand-written ops with a correct and a buggy backward each: the examples, tests and benchmark use them.

Every buggy variant here is a bug class seen in real kernel code; the docstring says which.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "xsin", "xsin_wrong", "xsin_squared_upstream", "xcos_consistent", "xsin_ref",
    "softmax", "softmax_no_cross_term", "softmax_naive", "softmax_ref",
    "layer_norm", "layer_norm_no_mean_term", "layer_norm_eps_dropped", "layer_norm_ref",
    "cross_entropy", "cross_entropy_ignore_bug", "cross_entropy_ref",
    "embedding", "embedding_overwrite", "embedding_ref",
    "scale_assumes_contiguous", "scale_ref",
    "CORRECT", "BUGGY",
]


# ---- seed 003: x * sin(x) -----------------------------------------------------------------------------
class _XSin(torch.autograd.Function):
    mode = "correct"

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sin(x)

    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved_tensors
        if cls.mode == "wrong":  # forgot the product rule: d/dx x sin x = sin x + x cos x
            return g * x * torch.cos(x)
        if cls.mode == "squared":  # uses the upstream gradient twice: passes gradcheck (unit cotangents)
            return g * g * (torch.sin(x) + x * torch.cos(x))
        return g * (torch.sin(x) + x * torch.cos(x))


class _XSinWrong(_XSin):
    mode = "wrong"


class _XSinSquared(_XSin):
    mode = "squared"


class _XCos(torch.autograd.Function):
    """Forward AND backward of x*cos(x) where x*sin(x) was meant: consistent, so gradcheck passes."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.cos(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (torch.cos(x) - x * torch.sin(x))


def xsin(x):
    return _XSin.apply(x)


def xsin_wrong(x):
    return _XSinWrong.apply(x)


def xsin_squared_upstream(x):
    return _XSinSquared.apply(x)


def xcos_consistent(x):
    return _XCos.apply(x)


def xsin_ref(x):
    return x * torch.sin(x)


# ---- softmax ------------------------------------------------------------------------------------------
class _Softmax(torch.autograd.Function):
    mode = "correct"

    @classmethod
    def forward(cls, ctx, x):
        if cls.mode == "naive":  # no max subtraction: exp overflows for large logits
            e = torch.exp(x)
        else:
            e = torch.exp(x - x.amax(dim=-1, keepdim=True))
        y = e / e.sum(dim=-1, keepdim=True)
        ctx.save_for_backward(y)
        return y

    @classmethod
    def backward(cls, ctx, g):
        (y,) = ctx.saved_tensors
        if cls.mode == "no_cross_term":  # only the Jacobian's diagonal y(1-y)
            return g * y * (1 - y)
        return y * (g - (g * y).sum(dim=-1, keepdim=True))


class _SoftmaxNoCross(_Softmax):
    mode = "no_cross_term"


class _SoftmaxNaive(_Softmax):
    mode = "naive"


def softmax(x):
    return _Softmax.apply(x)


def softmax_no_cross_term(x):
    return _SoftmaxNoCross.apply(x)


def softmax_naive(x):
    return _SoftmaxNaive.apply(x)


def softmax_ref(x):
    return torch.softmax(x, dim=-1)


# ---- layer norm (last dim, affine) --------------------------------------------------------------------
EPS = 1e-5


class _LayerNorm(torch.autograd.Function):
    mode = "correct"

    @classmethod
    def forward(cls, ctx, x, w, b):
        # statistics in float32 at least, as real kernels do (bf16 statistics lose the variance)
        dtype = x.dtype
        x, w, b = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (x, w, b))
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        rstd = torch.rsqrt(var + EPS)
        xhat = (x - mean) * rstd
        ctx.save_for_backward(xhat, rstd, w, var)
        ctx.dtype = dtype
        return (xhat * w + b).to(dtype)

    @classmethod
    def backward(cls, ctx, g):
        xhat, rstd, w, var = ctx.saved_tensors
        g = g.to(xhat.dtype)
        gx_hat = g * w
        reduce = tuple(range(g.dim() - 1))
        gw = (g * xhat).sum(dim=reduce)
        gb = g.sum(dim=reduce)
        if cls.mode == "eps_dropped":  # recomputes rstd without eps: fine unless the variance is near eps
            rstd = torch.rsqrt(var)
        if cls.mode == "no_mean_term":  # drops the xhat * mean(gx_hat * xhat) projection
            gx = rstd * (gx_hat - gx_hat.mean(dim=-1, keepdim=True))
        else:
            gx = rstd * (gx_hat - gx_hat.mean(dim=-1, keepdim=True) - xhat * (gx_hat * xhat).mean(dim=-1, keepdim=True))
        return gx.to(ctx.dtype), gw.to(ctx.dtype), gb.to(ctx.dtype)


class _LayerNormNoMean(_LayerNorm):
    mode = "no_mean_term"


class _LayerNormEpsDropped(_LayerNorm):
    mode = "eps_dropped"


def layer_norm(x, w, b):
    return _LayerNorm.apply(x, w, b)


def layer_norm_no_mean_term(x, w, b):
    return _LayerNormNoMean.apply(x, w, b)


def layer_norm_eps_dropped(x, w, b):
    return _LayerNormEpsDropped.apply(x, w, b)


def layer_norm_ref(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=EPS)


# ---- cross entropy with ignore_index (mean over non-ignored rows) -------------------------------------
class _CrossEntropy(torch.autograd.Function):
    mode = "correct"

    @classmethod
    def forward(cls, ctx, logits, target, ignore_index):
        valid = target != ignore_index
        safe = torch.where(valid, target, torch.zeros_like(target))
        logp = torch.log_softmax(logits, dim=-1)
        nll = -logp.gather(1, safe[:, None])[:, 0] * valid
        n_valid = valid.sum().clamp(min=1)
        ctx.save_for_backward(logp, safe, valid, n_valid)
        return nll.sum() / n_valid

    @classmethod
    def backward(cls, ctx, g):
        logp, safe, valid, n_valid = ctx.saved_tensors
        grad = logp.exp()
        grad[torch.arange(grad.shape[0]), safe] -= 1
        if cls.mode == "ignore_bug":  # forgets ignored rows in backward: averages over all rows
            return g * grad / grad.shape[0], None, None
        return g * grad * valid[:, None] / n_valid, None, None


class _CrossEntropyIgnoreBug(_CrossEntropy):
    mode = "ignore_bug"


def cross_entropy(logits, target, ignore_index=-100):
    return _CrossEntropy.apply(logits, target, ignore_index)


def cross_entropy_ignore_bug(logits, target, ignore_index=-100):
    return _CrossEntropyIgnoreBug.apply(logits, target, ignore_index)


def cross_entropy_ref(logits, target, ignore_index=-100):
    return F.cross_entropy(logits, target, ignore_index=ignore_index)


# ---- embedding (repeated indices must accumulate) -----------------------------------------------------
class _Embedding(torch.autograd.Function):
    mode = "correct"

    @classmethod
    def forward(cls, ctx, idx, weight, padding_idx):
        ctx.save_for_backward(idx)
        ctx.shape, ctx.padding_idx = weight.shape, padding_idx
        return weight[idx]

    @classmethod
    def backward(cls, ctx, g):
        (idx,) = ctx.saved_tensors
        gw = g.new_zeros(ctx.shape)
        flat_idx, flat_g = idx.reshape(-1), g.reshape(-1, ctx.shape[1])
        if cls.mode == "overwrite":  # last write wins for repeated indices
            gw[flat_idx] = flat_g
        else:
            gw.index_add_(0, flat_idx, flat_g)
        if ctx.padding_idx is not None:
            gw[ctx.padding_idx] = 0
        return None, gw, None


class _EmbeddingOverwrite(_Embedding):
    mode = "overwrite"


def embedding(idx, weight, padding_idx=None):
    return _Embedding.apply(idx, weight, padding_idx)


def embedding_overwrite(idx, weight, padding_idx=None):
    return _EmbeddingOverwrite.apply(idx, weight, padding_idx)


def embedding_ref(idx, weight, padding_idx=None):
    return F.embedding(idx, weight, padding_idx=padding_idx)


# ---- a kernel that assumes contiguous memory ----------------------------------------------------------
class _ScaleAssumesContiguous(torch.autograd.Function):
    """Reads its input as if it were contiguous (like a kernel indexing ``ptr + row * ncols + col``)."""

    @staticmethod
    def forward(ctx, x):
        flat = torch.as_strided(x, x.shape, torch.empty(x.shape).stride(), x.storage_offset())
        return flat * 3.0

    @staticmethod
    def backward(ctx, g):
        return g * 3.0


def scale_assumes_contiguous(x):
    return _ScaleAssumesContiguous.apply(x)


def scale_ref(x):
    return x * 3.0


def _inputs_xsin(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(10, generator=g, dtype=dtype),)


def _inputs_rows(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(4, 8, generator=g, dtype=dtype),)


def _inputs_ln(dtype=torch.float32):
    g = torch.Generator().manual_seed(2)
    return (torch.randn(4, 8, generator=g, dtype=dtype), 1 + 0.1 * torch.randn(8, generator=g, dtype=dtype),
            0.1 * torch.randn(8, generator=g, dtype=dtype))


def _inputs_ce(dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    return (torch.randn(6, 5, generator=g, dtype=dtype), torch.randint(0, 5, (6,), generator=g))


def _inputs_emb(dtype=torch.float32):
    g = torch.Generator().manual_seed(4)
    return (torch.randperm(7, generator=g)[:5], torch.randn(7, 3, generator=g, dtype=dtype))


# name -> (fn, reference, input factory, expected failing checks)  (empty set: correct)
CORRECT = {
    "xsin": (xsin, xsin_ref, _inputs_xsin),
    "softmax": (softmax, softmax_ref, _inputs_rows),
    "layer_norm": (layer_norm, layer_norm_ref, _inputs_ln),
    "cross_entropy": (cross_entropy, cross_entropy_ref, _inputs_ce),
    "embedding": (embedding, embedding_ref, _inputs_emb),
    "scale": (lambda x: _ScaleAssumesContiguous.apply(x.contiguous()), scale_ref, _inputs_rows),
}
BUGGY = {
    "xsin_wrong": (xsin_wrong, xsin_ref, _inputs_xsin),
    "xsin_squared_upstream": (xsin_squared_upstream, xsin_ref, _inputs_xsin),
    "xcos_consistent": (xcos_consistent, xsin_ref, _inputs_xsin),
    "softmax_no_cross_term": (softmax_no_cross_term, softmax_ref, _inputs_rows),
    "softmax_naive": (softmax_naive, softmax_ref, _inputs_rows),
    "layer_norm_no_mean_term": (layer_norm_no_mean_term, layer_norm_ref, _inputs_ln),
    "layer_norm_eps_dropped": (layer_norm_eps_dropped, layer_norm_ref, _inputs_ln),
    "cross_entropy_ignore_bug": (cross_entropy_ignore_bug, cross_entropy_ref, _inputs_ce),
    "embedding_overwrite": (embedding_overwrite, embedding_ref, _inputs_emb),
    "scale_assumes_contiguous": (scale_assumes_contiguous, scale_ref, _inputs_rows),
}
