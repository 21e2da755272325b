"""Correct ops that check_op's own regimes used to fail: each passes in float32, float64, bfloat16 and float16, with
and without a reference (the false failures measured on a corpus of correct ops; see docs/check_op.md)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gradguard

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


class _LayerNormNoBias(torch.autograd.Function):
    """Correct layer norm without bias: with a feature dim of 1 every output is 0 and the weight's gradient is
    rounding noise of a cancelled quantity."""

    @staticmethod
    def forward(ctx, x, w):  # statistics in float32 at least, as every real kernel does
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        mu = xf.mean(-1, keepdim=True)
        rstd = (xf.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
        xhat = (xf - mu) * rstd
        ctx.save_for_backward(xhat, w, rstd)
        return (xhat * w).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        xhat, w, rstd = ctx.saved_tensors
        gw = g.to(xhat.dtype) * w
        dx = rstd * (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True))
        return dx.to(g.dtype), (g.to(xhat.dtype) * xhat).sum(0).to(w.dtype)


def layer_norm(x, w):
    return _LayerNormNoBias.apply(x, w)


def layer_norm_ref(x, w):
    return F.layer_norm(x, (x.shape[-1],), w)


class _ScatterAdd(torch.autograd.Function):
    """out[i, index[i, j]] += src[i, j]; the backward gathers (and, like a kernel, insists on matching shapes)."""

    @staticmethod
    def forward(ctx, src, index, size):
        ctx.save_for_backward(index)
        return torch.zeros(src.shape[0], size, dtype=src.dtype).scatter_add(1, index, src)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        if index.shape[1] > g.shape[1] and index.max() >= g.shape[1]:
            raise RuntimeError("index out of range for grad_output")
        return g.gather(1, index), None, None


def scatter_add(src, index, size=5):
    return _ScatterAdd.apply(src, index, size)


def scatter_add_ref(src, index, size=5):
    return torch.zeros(src.shape[0], size, dtype=src.dtype).scatter_add(1, index, src)


def jsd(log_q, log_p):
    """Jensen-Shannon divergence of log-probabilities (Liger's formula): NaN where exp underflows to 0 in both."""
    p, q = log_p.exp(), log_q.exp()
    log_m = (0.5 * (p + q)).log()
    return 0.5 * ((p * (log_p - log_m)).sum(-1) + (q * (log_q - log_m)).sum(-1)).mean()


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, index, weight, padding_idx):
        ctx.save_for_backward(index)
        ctx.padding_idx, ctx.rows = padding_idx, weight.shape[0]
        return weight[index]

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        gw = torch.zeros(ctx.rows, g.shape[-1], dtype=g.dtype).index_add(0, index.reshape(-1), g.reshape(-1, g.shape[-1]))
        gw[ctx.padding_idx] = 0
        return None, gw, None


def embedding(index, weight, padding_idx=0):
    return _Embedding.apply(index, weight, padding_idx)


def embedding_ref(index, weight, padding_idx=0):
    return F.embedding(index, weight, padding_idx)


def _inputs(name, dtype):
    g = torch.Generator().manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    if name == "layer_norm":
        return layer_norm, layer_norm_ref, (rand(4, 8), 1 + 0.1 * rand(8))
    if name == "scatter_add":
        return scatter_add, scatter_add_ref, (rand(3, 5), torch.randint(0, 5, (3, 5), generator=g))
    if name == "jsd":
        return jsd, None, (torch.log_softmax(rand(4, 6).double(), -1).to(dtype),
                           torch.log_softmax(rand(4, 6).double(), -1).to(dtype))
    if name == "embedding":
        return embedding, embedding_ref, (torch.tensor([[1, 5, 2], [7, 3, 0]]), rand(9, 3))
    raise KeyError(name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["layer_norm", "scatter_add", "jsd", "embedding"])
@pytest.mark.parametrize("with_reference", [True, False], ids=["reference", "no_reference"])
def test_correct_op_passes(name, dtype, with_reference):
    fn, ref, args = _inputs(name, dtype)
    if with_reference and ref is None:
        pytest.skip("no trusted reference for this op")
    report = gradguard.check_op(fn, *args, reference=ref if with_reference else None)
    assert report.passed, str(report)


def test_layer_norm_feature_dim_one_is_judged_at_the_scale_of_its_inputs():
    fn, ref, args = _inputs("layer_norm", torch.float32)
    report = gradguard.check_op(fn, *args, reference=ref, regimes=["feature_dim"])
    ran = {c.detail: c.status for c in report.checks if c.check == "regime.feature_dim"}
    assert ran["last dimension 8 -> 1 (size 1) on every float input that has it"] == "pass", ran


def test_scatter_add_index_grows_with_the_source():
    fn, ref, args = _inputs("scatter_add", torch.float32)
    report = gradguard.check_op(fn, *args, reference=ref, regimes=["feature_dim"])
    statuses = [c.status for c in report.checks if c.check == "regime.feature_dim"]
    assert statuses == ["pass", "pass"], str(report)


def test_input_outside_the_domain_is_a_skipped_regime():
    fn, _, args = _inputs("jsd", torch.float32)
    report = gradguard.check_op(fn, *args, regimes=["large_magnitude"])
    x1000, moderate = [c for c in report.checks if c.check == "regime.large_magnitude"]
    assert x1000.status == "skip" and "outside fn's domain" in x1000.detail, str(report)
    # then the inputs are scaled only as far as exp overflows float32 and not float64: still judged, and right
    assert moderate.status == "pass" and "(largest 100)" in moderate.detail and report.passed, str(report)


class _RoundSTE(torch.autograd.Function):
    """Rounding with a straight-through backward (quantisation-aware training): the gradient is 1 by design."""

    scale = 1.0

    @classmethod
    def forward(cls, ctx, x):
        return torch.round(x)

    @classmethod
    def backward(cls, ctx, g):
        return g * cls.scale


class _RoundSTEWrong(_RoundSTE):
    scale = 0.5


def test_declared_surrogate_gradient_replaces_finite_differences():
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(5)) * 3
    # finite differences of round() are 0 (or huge at .5): the straight-through gradient fails them by design
    assert "gradient.numerical" in gradguard.check_op(_RoundSTE.apply, x, regimes=[]).failed_checks()
    report = gradguard.check_op(_RoundSTE.apply, x, surrogate=lambda x: x)
    assert report.passed, str(report)
    assert any(c.check == "gradient.surrogate" and c.status == "pass" for c in report.checks)
    wrong = gradguard.check_op(_RoundSTEWrong.apply, x, surrogate=lambda x: x)
    assert "gradient.surrogate" in wrong.failed_checks()
    with pytest.raises(gradguard.InvalidArgument, match="surrogate must be callable"):
        gradguard.check_op(_RoundSTE.apply, x, surrogate=1.0)


class _LayerNormFloat32Math(torch.autograd.Function):
    """float64 in and out, the normalisation in float32 (a kernel that loads float64 and computes in float32)."""

    @staticmethod
    def forward(ctx, x, w, b):
        xf = x.float()
        xhat = (xf - xf.mean(-1, keepdim=True)) * (xf.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
        ctx.save_for_backward(xhat, (xf.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt(), w)
        return xhat.double() * w + b

    @staticmethod
    def backward(ctx, g):
        xhat, rstd, w = ctx.saved_tensors
        gw = (g * w).float()
        dx = rstd * (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True))
        return dx.double(), (g * xhat.double()).sum(0), g.sum(0)


@pytest.mark.parametrize("with_reference", [True, False], ids=["reference", "no_reference"])
def test_float32_math_on_float64_inputs_gets_float32_tolerances(with_reference):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, 8, generator=g, dtype=torch.float64)
    w, b = 1 + 0.1 * torch.randn(8, generator=g, dtype=torch.float64), 0.1 * torch.randn(8, generator=g, dtype=torch.float64)
    ref = (lambda x, w, b: F.layer_norm(x, (8,), w, b)) if with_reference else None
    report = gradguard.check_op(_LayerNormFloat32Math.apply, x, w, b, reference=ref)
    assert report.passed, str(report)
    assert any("float32 tolerances" in n for n in report.notes)


class _CrashesOnOneRow(torch.autograd.Function):
    """A kernel without bounds checks: reads through a null pointer when the batch has one row."""

    @staticmethod
    def forward(ctx, x):
        if x.shape[0] == 1:
            import ctypes

            ctypes.string_at(0)  # SIGSEGV, as an out-of-bounds kernel write does
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_a_crash_in_a_regime_is_a_reported_failure_when_isolated():
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(7))
    report = gradguard.check_op(_CrashesOnOneRow.apply, x, regimes=["batch_size"], isolate=True)
    (crash,) = report.failures
    assert crash.check == "regime.batch_size" and "killed by SIGSEGV" in crash.message, str(report)
    assert "leading dimension 4 -> 1" in crash.message
    with pytest.raises(gradguard.InvalidArgument, match="isolate must be True, False or 'auto'"):
        gradguard.check_op(_CrashesOnOneRow.apply, x, isolate="yes")


class _RouteTokens(torch.autograd.Function):
    """MoE-style gather of token rows by a routing index (token ids, top-2 per token) that lives beside the tokens;
    like a compiled kernel it trusts the ids to be in range (the guard stands for its out-of-bounds write)."""

    @staticmethod
    def forward(ctx, x, token_ids):
        if int(token_ids.max()) >= x.shape[0]:
            raise IndexError("token id out of range: a kernel would write out of bounds here")
        ctx.save_for_backward(token_ids)
        ctx.rows = x.shape[0]
        return x[token_ids]

    @staticmethod
    def backward(ctx, g):
        (ids,) = ctx.saved_tensors
        return torch.zeros(ctx.rows, g.shape[-1], dtype=g.dtype).index_add(0, ids, g), None


def test_routing_indices_shrink_with_the_batch():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(4, 3, generator=g)
    ids = torch.tensor([2, 0, 3, 1, 1, 2, 0, 3])  # 2 per token, not batched with x
    report = gradguard.check_op(_RouteTokens.apply, x, ids, regimes=["batch_size"],
                                reference=lambda x, ids: x[ids])
    assert report.passed, str(report)
    assert [c.status for c in report.checks if c.check == "regime.batch_size"] == ["pass", "pass"]
