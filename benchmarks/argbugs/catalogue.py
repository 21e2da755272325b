"""Argument-dependent gradient bugs: ops whose hand-written backward is right for the arguments a test usually
passes (the defaults) and wrong for others (another ``dim``, ``causal=True``, rows hitting ``ignore_index``, inputs
beyond a clamp bound or a softplus threshold, an eps that clamps, a non-zero offset).

Each case is a correct op and its mutant (same forward, backward wrong only under some argument value), a trusted
reference with the same signature, and inputs. The call is the one a gradcheck user makes: the tensors, and the
scalars the test passes positionally (often none: the defaults). ``check_op`` must catch every mutant and pass every
correct op in float32, float64, bfloat16 and float16 (``tests/fast/test_check_op_arguments.py``;
``benchmarks/argbugs/score.py`` times it against gradcheck).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

__all__ = ["Case", "CASES"]


@dataclass
class Case:
    name: str
    correct: Callable
    mutant: Callable
    reference: Callable
    make: Callable[[torch.dtype, torch.Generator], tuple]  # the positional inputs (tensors, then scalars)
    needs: str  # the argument value the mutant's bug needs (what the report must name)
    kwargs: dict = field(default_factory=dict)


def _fn(cls, name, signature):
    """A plain function with a signature (defaults the audit can read) that calls ``cls.apply``."""
    ns: dict[str, Any] = {"cls": cls}
    params = ", ".join(signature)
    call = ", ".join(p.split("=")[0] for p in signature)
    exec(f"def {name}({params}):\n    return cls.apply({call})\n", ns)  # noqa: S102 - builds a signature, no input
    return ns[name]


# ---- reductions along a dim --------------------------------------------------------------------------------------
class LogSumExp(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, dim):
        y = torch.logsumexp(x, dim)
        ctx.save_for_backward(x, y)
        ctx.dim = dim
        return y

    @classmethod
    def backward(cls, ctx, g):
        x, y = ctx.saved_tensors
        if cls.bug:  # bug: the softmax of the last dim, whatever dim was reduced
            return torch.softmax(x, -1) * g.unsqueeze(ctx.dim), None
        return torch.exp(x - y.unsqueeze(ctx.dim)) * g.unsqueeze(ctx.dim), None


class LogSumExpBug(LogSumExp):
    bug = True


class Softmax(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, dim):
        y = torch.softmax(x, dim)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @classmethod
    def backward(cls, ctx, g):
        (y,) = ctx.saved_tensors
        d = -1 if cls.bug else ctx.dim
        return y * (g - (y * g).sum(d, keepdim=True)), None


class SoftmaxBug(Softmax):
    bug = True


class LogSoftmax(torch.autograd.Function):
    """Bug: negative dims normalised with ndim - 1 (right for dim=-1 only... and the non-negative ones)."""

    bug = False

    @classmethod
    def forward(cls, ctx, x, dim):
        y = torch.log_softmax(x, dim)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @classmethod
    def backward(cls, ctx, g):
        (y,) = ctx.saved_tensors
        d = ctx.dim
        if cls.bug and d < -1:
            d = d + y.ndim - 1
        return g - y.exp() * g.sum(d, keepdim=True), None


class LogSoftmaxBug(LogSoftmax):
    bug = True


class Gather(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, index, dim):
        ctx.save_for_backward(index)
        ctx.dim, ctx.shape = dim, x.shape
        return torch.gather(x, dim, index)

    @classmethod
    def backward(cls, ctx, g):
        (index,) = ctx.saved_tensors
        d = -1 if cls.bug else ctx.dim
        return torch.zeros(ctx.shape, dtype=g.dtype).scatter_add(d, index, g), None, None


class GatherBug(Gather):
    bug = True


class CumSum(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, dim, reverse):
        ctx.dim, ctx.reverse = dim, reverse
        return x.flip(dim).cumsum(dim).flip(dim) if reverse else x.cumsum(dim)

    @classmethod
    def backward(cls, ctx, g):
        d = ctx.dim
        if ctx.reverse and not cls.bug:  # bug: the backward of the forward-direction cumsum, always
            return g.cumsum(d), None, None
        return g.flip(d).cumsum(d).flip(d), None, None


class CumSumBug(CumSum):
    bug = True


class Mean(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, dim, keepdim):
        ctx.dim, ctx.keepdim, ctx.shape = dim, keepdim, x.shape
        return x.mean(dim, keepdim=keepdim)

    @classmethod
    def backward(cls, ctx, g):
        n = ctx.shape[ctx.dim]
        if not ctx.keepdim:
            g = g.unsqueeze(ctx.dim)
        elif cls.bug:  # bug: keepdim's gradient taken for a sum (no 1/n)
            n = 1
        return g.expand(ctx.shape) / n, None, None


class MeanBug(Mean):
    bug = True


class Sort(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, descending):
        values, idx = torch.sort(x, -1, descending=descending)
        ctx.save_for_backward(idx if not cls.bug else torch.sort(x, -1).indices)  # bug: ascending indices always
        return values

    @classmethod
    def backward(cls, ctx, g):
        (idx,) = ctx.saved_tensors
        return torch.zeros_like(g).scatter(-1, idx, g), None


class SortBug(Sort):
    bug = True


# ---- ignore_index / padding_idx --------------------------------------------------------------------------------
def _ce_backward(logits, target, ignore_index, g, mask_rows=True, denominator_all=False):
    keep = target != ignore_index
    safe = torch.where(keep, target, torch.zeros_like(target))
    p = torch.softmax(_up(logits), -1)
    grad = p - F.one_hot(safe, logits.shape[-1]).to(p.dtype)
    if mask_rows:
        grad = grad * keep.unsqueeze(-1)
    count = target.numel() if denominator_all else keep.sum().clamp(min=1)
    return grad * (g.to(p.dtype) / count)


class CrossEntropy(torch.autograd.Function):
    mask_rows, denominator_all = True, False

    @classmethod
    def forward(cls, ctx, logits, target, ignore_index):
        ctx.save_for_backward(logits, target)
        ctx.ignore_index = ignore_index
        return F.cross_entropy(_up(logits), target, ignore_index=ignore_index).to(logits.dtype)

    @classmethod
    def backward(cls, ctx, g):
        logits, target = ctx.saved_tensors
        grad = _ce_backward(logits, target, ctx.ignore_index, g, cls.mask_rows, cls.denominator_all)
        return grad.to(logits.dtype), None, None


class CrossEntropyUnmasked(CrossEntropy):
    mask_rows = False


class CrossEntropyDenominator(CrossEntropy):
    denominator_all = True


class FusedLinearCrossEntropy(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, h, w, target, ignore_index):
        logits = _up(h) @ _up(w).t()
        ctx.save_for_backward(h, w, logits, target)
        ctx.ignore_index = ignore_index
        return F.cross_entropy(logits, target, ignore_index=ignore_index).to(h.dtype)

    @classmethod
    def backward(cls, ctx, g):
        h, w, logits, target = ctx.saved_tensors
        dlogits = _ce_backward(logits, target, ctx.ignore_index, g)
        dh = dlogits @ _up(w)
        if cls.bug:  # bug: the weight gradient recomputed without the ignore mask
            dlogits = _ce_backward(logits, target, ctx.ignore_index, g, mask_rows=False)
        return dh.to(h.dtype), (dlogits.t() @ _up(h)).to(w.dtype), None, None


class FusedLinearCrossEntropyBug(FusedLinearCrossEntropy):
    bug = True


class Embedding(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, index, weight, padding_idx):
        ctx.save_for_backward(index)
        ctx.padding_idx, ctx.rows = padding_idx, weight.shape[0]
        return weight[index]

    @classmethod
    def backward(cls, ctx, g):
        (index,) = ctx.saved_tensors
        gw = torch.zeros(ctx.rows, g.shape[-1], dtype=g.dtype).index_add(0, index.reshape(-1), g.reshape(-1, g.shape[-1]))
        if not cls.bug and ctx.padding_idx is not None:
            gw[ctx.padding_idx] = 0
        return None, gw, None


class EmbeddingBug(Embedding):
    bug = True


# ---- attention and positions -----------------------------------------------------------------------------------
def _up(t):
    """float32 for float16/bfloat16 tensors: the math of every real low-precision kernel accumulates in float32."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _attention_probs(q, k, causal, diagonal=1):
    s = _up(q) @ _up(k).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        L = q.shape[-2]
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(diagonal), float("-inf"))
    return torch.softmax(s, -1)


class Attention(torch.autograd.Function):
    diagonal = 1  # the diagonal the backward's recomputed mask starts at (1: the forward's)
    backward_mask = True

    @classmethod
    def forward(cls, ctx, q, k, v, causal):
        ctx.save_for_backward(q, k, v)
        ctx.causal = causal
        return (_attention_probs(q, k, causal) @ _up(v)).to(q.dtype)

    @classmethod
    def backward(cls, ctx, g):
        q, k, v = ctx.saved_tensors
        dt, g, q, k, v = q.dtype, _up(g), _up(q), _up(k), _up(v)
        p = _attention_probs(q, k, ctx.causal and cls.backward_mask, cls.diagonal)
        dv = p.transpose(-1, -2) @ g
        dp = g @ v.transpose(-1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) / math.sqrt(q.shape[-1])
        return (ds @ k).to(dt), (ds.transpose(-1, -2) @ q).to(dt), dv.to(dt), None


class AttentionNoMask(Attention):
    backward_mask = False


class AttentionOffByOne(Attention):
    diagonal = 2  # the backward lets each query see one future key


def attention_ref(q, k, v, causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _rope_angles(L, D, offset, dtype):
    pos = torch.arange(L, dtype=torch.float64) + offset
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = pos[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _rotate_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat([-x2, x1], -1)


def _rotate_half_t(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x2, -x1], -1)


class Rope(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, offset):
        cos, sin = _rope_angles(x.shape[-2], x.shape[-1], offset, x.dtype)
        ctx.offset = offset
        return x * cos + _rotate_half(x) * sin

    @classmethod
    def backward(cls, ctx, g):
        cos, sin = _rope_angles(g.shape[-2], g.shape[-1], 0 if cls.bug else ctx.offset, g.dtype)
        return g * cos + _rotate_half_t(g * sin), None


class RopeBug(Rope):
    bug = True


def rope_ref(x, offset=0):
    cos, sin = _rope_angles(x.shape[-2], x.shape[-1], offset, x.dtype)
    return x * cos + _rotate_half(x) * sin


class Triu(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, diagonal):
        ctx.diagonal = diagonal
        return x.triu(diagonal)

    @classmethod
    def backward(cls, ctx, g):
        return g.triu(0 if cls.bug else ctx.diagonal), None


class TriuBug(Triu):
    bug = True


class Roll(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, shift):
        ctx.shift = shift
        return x.roll(shift, -1)

    @classmethod
    def backward(cls, ctx, g):
        return g.roll(ctx.shift if cls.bug else -ctx.shift, -1), None


class RollBug(Roll):
    bug = True


# ---- bounds, thresholds, eps, offsets ----------------------------------------------------------------------------
class Clamp(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, min, max):  # noqa: A002 - torch.clamp's names
        ctx.save_for_backward(x)
        ctx.bounds = (min, max)
        return x.clamp(min, max)

    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved_tensors
        lo, hi = ctx.bounds
        if cls.bug:  # bug: only the lower bound stops the gradient
            return g * (x >= lo), None, None
        return g * ((x >= lo) & (x <= hi)), None, None


class ClampBug(Clamp):
    bug = True


class Hardtanh(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, min_val, max_val):
        ctx.save_for_backward(x)
        ctx.bounds = (min_val, max_val)
        return F.hardtanh(x, min_val, max_val)

    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved_tensors
        lo, hi = ctx.bounds
        if cls.bug:  # bug: assumes symmetric bounds
            return g * (x.abs() < hi), None, None
        return g * ((x > lo) & (x < hi)), None, None


class HardtanhBug(Hardtanh):
    bug = True


class Softplus(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, beta, threshold):
        ctx.save_for_backward(x)
        ctx.beta, ctx.threshold = beta, threshold
        return F.softplus(x, beta, threshold)

    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved_tensors
        z = x * ctx.beta
        linear = z > ctx.threshold
        s = torch.sigmoid(z)
        grad = torch.where(linear, torch.zeros_like(s) if cls.bug else torch.ones_like(s), s)
        return g * grad, None, None


class SoftplusBug(Softplus):
    bug = True


class L2Normalize(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, eps):
        n = x.norm(dim=-1, keepdim=True)
        y = x / n.clamp_min(eps)
        ctx.save_for_backward(y, n)
        ctx.eps = eps
        return y

    @classmethod
    def backward(cls, ctx, g):
        y, n = ctx.saved_tensors
        full = (g - y * (g * y).sum(-1, keepdim=True)) / n.clamp_min(ctx.eps)
        if cls.bug:  # bug: the clamp is forgotten in backward
            return full, None
        return torch.where(n > ctx.eps, full, g / ctx.eps), None


class L2NormalizeBug(L2Normalize):
    bug = True


class LayerNorm(torch.autograd.Function):
    bug = False

    @classmethod
    def forward(cls, ctx, x, w, b, eps):
        xf = _up(x)
        mu = xf.mean(-1, keepdim=True)
        var = xf.var(-1, unbiased=False, keepdim=True)
        rstd = (var + eps).rsqrt()
        xhat = (xf - mu) * rstd
        ctx.save_for_backward(xf, _up(w), mu, var)
        ctx.eps = eps
        return (xhat * _up(w) + _up(b)).to(x.dtype)

    @classmethod
    def backward(cls, ctx, g):
        x, w, mu, var = ctx.saved_tensors
        dt, g = g.dtype, _up(g)
        rstd = (var + (0.0 if cls.bug else ctx.eps)).rsqrt()  # bug: eps left out of the backward's rstd
        xhat = (x - mu) * rstd
        gw = g * w
        dx = rstd * (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True))
        rows = tuple(range(g.ndim - 1))
        return dx.to(dt), (g * xhat).sum(rows).to(dt), g.sum(rows).to(dt), None


class LayerNormBug(LayerNorm):
    bug = True


def layer_norm_ref(x, w, b, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


class RMSNormOffset(torch.autograd.Function):
    """Gemma-style RMS norm: y = x / rms(x) * (offset + w)."""

    bug = False

    @classmethod
    def forward(cls, ctx, x, w, offset):
        xf, wf = _up(x), _up(w)
        rstd = (xf.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()
        ctx.save_for_backward(xf, wf, rstd)
        ctx.offset = offset
        return (xf * rstd * (offset + wf)).to(x.dtype)

    @classmethod
    def backward(cls, ctx, g):
        x, w, rstd = ctx.saved_tensors
        dt, g = g.dtype, _up(g)
        xhat = x * rstd
        gw = g * (w if cls.bug else ctx.offset + w)  # bug: the offset is left out of the input gradient
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        return dx.to(dt), (g * xhat).sum(tuple(range(g.ndim - 1))).to(dt), None


class RMSNormOffsetBug(RMSNormOffset):
    bug = True


def rms_norm_offset_ref(x, w, offset=0.0):
    xf = _up(x)
    return (xf * (xf.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * (offset + _up(w))).to(x.dtype)


# ---- the catalogue --------------------------------------------------------------------------------------------
def _randn(g, dtype, *shape, scale=1.0):
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def _case(name, cls, bug_cls, signature, reference, make, needs, kwargs=None):
    fname = name.replace("-", "_")
    return Case(name, _fn(cls, fname, signature), _fn(bug_cls, fname, signature), reference, make, needs,
                kwargs or {})


CASES: list[Case] = [
    _case("logsumexp_dim", LogSumExp, LogSumExpBug, ["x", "dim=-1"], lambda x, dim=-1: torch.logsumexp(x, dim),
          lambda dt, g: (_randn(g, dt, 4, 5),), "`dim=0`"),
    _case("softmax_dim", Softmax, SoftmaxBug, ["x", "dim=-1"], lambda x, dim=-1: torch.softmax(x, dim),
          lambda dt, g: (_randn(g, dt, 3, 4, 5),), "`dim=0`"),
    _case("log_softmax_negative_dim", LogSoftmax, LogSoftmaxBug, ["x", "dim=1"],
          lambda x, dim=1: torch.log_softmax(x, dim), lambda dt, g: (_randn(g, dt, 3, 4, 5),), "`dim=-2`"),
    _case("gather_dim", Gather, GatherBug, ["x", "index", "dim=-1"],
          lambda x, index, dim=-1: torch.gather(x, dim, index),
          lambda dt, g: (_randn(g, dt, 4, 5), torch.randint(0, 4, (4, 5), generator=g)), "`dim=0`"),
    _case("cumsum_reverse", CumSum, CumSumBug, ["x", "dim=-1", "reverse=False"],
          lambda x, dim=-1, reverse=False: x.flip(dim).cumsum(dim).flip(dim) if reverse else x.cumsum(dim),
          lambda dt, g: (_randn(g, dt, 3, 6),), "`reverse=True`"),
    _case("mean_keepdim", Mean, MeanBug, ["x", "dim=-1", "keepdim=False"],
          lambda x, dim=-1, keepdim=False: x.mean(dim, keepdim=keepdim),
          lambda dt, g: (_randn(g, dt, 3, 6),), "`keepdim=True`"),
    _case("sort_descending", Sort, SortBug, ["x", "descending=False"],
          lambda x, descending=False: torch.sort(x, -1, descending=descending).values,
          lambda dt, g: (_randn(g, dt, 3, 6),), "`descending=True`"),
    _case("cross_entropy_ignore_index_rows", CrossEntropy, CrossEntropyUnmasked, ["logits", "target", "ignore_index=-100"],
          lambda logits, target, ignore_index=-100: F.cross_entropy(_up(logits), target, ignore_index=ignore_index).to(logits.dtype),
          lambda dt, g: (_randn(g, dt, 6, 5), torch.randint(0, 5, (6,), generator=g)), "`ignore_index=-100`"),
    _case("cross_entropy_ignore_index_denominator", CrossEntropy, CrossEntropyDenominator,
          ["logits", "target", "ignore_index=-100"],
          lambda logits, target, ignore_index=-100: F.cross_entropy(_up(logits), target, ignore_index=ignore_index).to(logits.dtype),
          lambda dt, g: (_randn(g, dt, 6, 5), torch.randint(0, 5, (6,), generator=g)), "`ignore_index=-100`"),
    _case("fused_linear_cross_entropy_ignore_index", FusedLinearCrossEntropy, FusedLinearCrossEntropyBug,
          ["h", "w", "target", "ignore_index=-100"],
          lambda h, w, target, ignore_index=-100: F.cross_entropy(_up(h) @ _up(w).t(), target, ignore_index=ignore_index).to(h.dtype),
          lambda dt, g: (_randn(g, dt, 6, 4), _randn(g, dt, 5, 4), torch.randint(0, 5, (6,), generator=g)),
          "`ignore_index=-100`"),
    _case("embedding_padding_idx", Embedding, EmbeddingBug, ["index", "weight", "padding_idx"],
          lambda index, weight, padding_idx: F.embedding(index, weight, padding_idx),
          lambda dt, g: (torch.tensor([[0, 2, 4], [1, 3, 2]]), _randn(g, dt, 6, 3), 5), "`padding_idx=5`"),
    _case("attention_causal_mask", Attention, AttentionNoMask, ["q", "k", "v", "causal=False"], attention_ref,
          lambda dt, g: (_randn(g, dt, 2, 4, 3), _randn(g, dt, 2, 4, 3), _randn(g, dt, 2, 4, 3)), "`causal=True`"),
    _case("attention_causal_off_by_one", Attention, AttentionOffByOne, ["q", "k", "v", "causal=False"], attention_ref,
          lambda dt, g: (_randn(g, dt, 2, 4, 3), _randn(g, dt, 2, 4, 3), _randn(g, dt, 2, 4, 3)), "`causal=True`"),
    _case("rope_offset", Rope, RopeBug, ["x", "offset=0"], rope_ref,
          lambda dt, g: (_randn(g, dt, 2, 5, 4),), "`offset=3`"),
    _case("triu_diagonal", Triu, TriuBug, ["x", "diagonal=0"], lambda x, diagonal=0: x.triu(diagonal),
          lambda dt, g: (_randn(g, dt, 4, 5),), "`diagonal=3`"),
    _case("roll_shift", Roll, RollBug, ["x", "shift=0"], lambda x, shift=0: x.roll(shift, -1),
          lambda dt, g: (_randn(g, dt, 3, 5),), "`shift=3`"),
    _case("clamp_max_bound", Clamp, ClampBug, ["x", "min=-1.0", "max=1.0"],
          lambda x, min=-1.0, max=1.0: x.clamp(min, max),  # noqa: A002
          lambda dt, g: (_randn(g, dt, 4, 5, scale=0.25).clamp(-0.9, 0.9),), "`max=1.0`"),
    _case("hardtanh_bounds", Hardtanh, HardtanhBug, ["x", "min_val=-1.0", "max_val=1.0"],
          lambda x, min_val=-1.0, max_val=1.0: F.hardtanh(x, min_val, max_val),
          lambda dt, g: (_randn(g, dt, 4, 5, scale=0.25).clamp(-0.9, 0.9), -2.0, 1.0), "`min_val=-2.0`"),
    _case("softplus_threshold", Softplus, SoftplusBug, ["x", "beta=1.0", "threshold=20.0"],
          lambda x, beta=1.0, threshold=20.0: F.softplus(x, beta, threshold),
          lambda dt, g: (_randn(g, dt, 4, 5),), "`threshold=20.0`"),
    _case("l2_normalize_eps", L2Normalize, L2NormalizeBug, ["x", "eps=1e-12"],
          lambda x, eps=1e-12: F.normalize(x, dim=-1, eps=eps), lambda dt, g: (_randn(g, dt, 4, 5),), "`eps="),
    _case("layer_norm_eps", LayerNorm, LayerNormBug, ["x", "w", "b", "eps=1e-5"], layer_norm_ref,
          lambda dt, g: (_randn(g, dt, 4, 6, scale=10.0), 1 + _randn(g, dt, 6, scale=0.1), _randn(g, dt, 6, scale=0.1)),
          "`eps="),
    _case("rms_norm_offset", RMSNormOffset, RMSNormOffsetBug, ["x", "w", "offset=0.0"], rms_norm_offset_ref,
          lambda dt, g: (_randn(g, dt, 4, 6), _randn(g, dt, 6, scale=0.1) + 1), "`offset=1.0`"),
]
