"""Regimes that published kernel bugs needed (issue 15, point 6): each bug passes on the given inputs and
is caught by exactly the regime that models it; the fixed op passes every regime."""

from __future__ import annotations

import pathlib
import sys

import torch

import gradguard

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "ops"))
import kernels as K  # noqa: E402

BLOCK = 8


def _g(seed):
    return torch.Generator().manual_seed(seed)


class _SoftmaxOneBlock(torch.autograd.Function):
    """Backward reduces only the first BLOCK columns (a Triton block-size bug): right when d <= BLOCK."""

    fixed = False

    @classmethod
    def forward(cls, ctx, x):
        y = torch.softmax(x, -1)
        ctx.save_for_backward(y)
        return y

    @classmethod
    def backward(cls, ctx, g):
        (y,) = ctx.saved_tensors
        cols = slice(None) if cls.fixed else slice(0, BLOCK)
        return y * (g - (y[..., cols] * g[..., cols]).sum(-1, keepdim=True))


class _SoftmaxFixed(_SoftmaxOneBlock):
    fixed = True


def test_feature_dim_not_a_power_of_two():
    x = torch.randn(3, BLOCK, generator=_g(0))
    ref = lambda x: torch.softmax(x, -1)  # noqa: E731
    report = gradguard.check_op(_SoftmaxOneBlock.apply, x, reference=ref, regimes=["feature_dim"])
    assert report.failed_checks() == {"regime.feature_dim"}
    assert "8 -> 11 (not a power of two)" in report.root_cause.message
    assert gradguard.check_op(_SoftmaxFixed.apply, x, reference=ref, regimes=["feature_dim"]).passed


class _AffineBiasOnlyBug(torch.autograd.Function):
    """y = x * 2 + b; when x needs no grad the bias gradient takes x's branch by mistake (needs_input_grad)."""

    @staticmethod
    def forward(ctx, x, b):
        return x * 2 + b

    @staticmethod
    def backward(ctx, g):
        if ctx.needs_input_grad[0]:
            return g * 2, g.sum(0)
        return None, g.sum(0) * 2


def _affine(x, b):
    return _AffineBiasOnlyBug.apply(x, b)


def test_subset_of_inputs_requiring_grad():
    x, b = torch.randn(4, 3, generator=_g(1)), torch.randn(3, generator=_g(2))
    report = gradguard.check_op(_affine, x, b, regimes=["grad_subset"])
    assert report.failed_checks() == {"regime.grad_subset"}
    assert report.root_cause.message.endswith("(only b requires grad)")


class _LogSoftmaxLastDimOnly(torch.autograd.Function):
    """Backward always reduces over the last dimension, whatever ``dim`` the forward used."""

    @staticmethod
    def forward(ctx, x, dim):
        y = torch.log_softmax(x, dim)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g - y.exp() * g.sum(-1, keepdim=True), None


def test_dim_other_than_last():
    x = torch.randn(4, 5, generator=_g(3))
    op = lambda x, dim: _LogSoftmaxLastDimOnly.apply(x, dim)  # noqa: E731
    report = gradguard.check_op(op, x, kwargs=dict(dim=-1), regimes=["reduction_dim"])
    assert report.failed_checks() == {"regime.reduction_dim"}
    assert "dim=-1 -> dim=0" in report.root_cause.message
    good = lambda x, dim: torch.log_softmax(x, dim)  # noqa: E731
    assert gradguard.check_op(good, x, kwargs=dict(dim=-1), regimes=["reduction_dim"]).passed


def test_ignore_index_passed_positionally_is_probed():
    logits = torch.randn(6, 5, generator=_g(4))
    target = torch.tensor([0, 3, 2, 1, 3, 1])
    report = gradguard.check_op(K.cross_entropy_ignore_bug, logits, target, -100, reference=K.cross_entropy_ref,
                                regimes=["sentinel_indices"])
    assert report.failed_checks() == {"regime.sentinel_indices"}, str(report)
    assert gradguard.check_op(K.cross_entropy, logits, target, -100, reference=K.cross_entropy_ref,
                              regimes=["sentinel_indices"]).passed


class _SparsemaxSqueezeAll(torch.autograd.Function):
    """entmax's sparsemax before deep-spin/entmax#18: the backward squeezes every size-1 dimension."""

    @staticmethod
    def forward(ctx, x, fixed):
        ctx.fixed = fixed
        z = x - x.max(-1, keepdim=True).values
        srt = z.sort(-1, descending=True).values
        rho = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype)
        cum = srt.cumsum(-1) - 1
        support = (rho * srt > cum).sum(-1, keepdim=True)
        tau = cum.gather(-1, support - 1) / support.to(z.dtype)
        out = torch.clamp(z - tau, min=0)
        ctx.save_for_backward(support, out)
        return out

    @staticmethod
    def backward(ctx, g):
        support, out = ctx.saved_tensors
        gi = g.clone()
        gi[out == 0] = 0
        size = support.to(out.dtype).squeeze(-1) if ctx.fixed else support.to(out.dtype).squeeze()
        v_hat = (gi.sum(-1) / size).unsqueeze(-1)
        return torch.where(out != 0, gi - v_hat, gi), None


def test_a_size_1_dimension_is_probed():
    x = torch.randn(4, 6, dtype=torch.float64, generator=_g(5))
    report = gradguard.check_op(lambda x: _SparsemaxSqueezeAll.apply(x, False), x, regimes=["singleton_dim"])
    assert report.failed_checks() == {"regime.singleton_dim"}, str(report)
    assert report.root_cause.message == ("gradient of x changes when the inputs get a size-1 dimension (same values; the "
                                         "forward agrees) (a size-1 dimension inserted before the last on every input "
                                         "with 2+ dimensions)")
    assert "squeeze(dim)" in report.root_cause.fix
    assert gradguard.check_op(lambda x: _SparsemaxSqueezeAll.apply(x, True), x, regimes=["singleton_dim"]).passed


def test_a_size_1_dimension_does_not_apply_to_rank_specific_ops():
    x = torch.randn(4, 5, dtype=torch.float64, generator=_g(6))
    row0 = lambda x: -torch.log_softmax(x, dim=-1)[:, 0].mean()  # noqa: E731  # [:, 0] means another thing in 3-D
    two_d = lambda x: x.view(x.shape[0], x.shape[1]).sin()  # noqa: E731  # rejects 3-D
    for fn in (row0, two_d):
        report = gradguard.check_op(fn, x, regimes=["singleton_dim"])
        assert report.passed, str(report)
        skip = next(c for c in report.checks if c.check == "regime.singleton_dim")
        assert skip.status == "skip" and "regime not applicable" in skip.detail, skip


class _PartlyFloat32(torch.autograd.Function):
    """Loads float64, computes the normaliser in float32 (Liger's cross entropy does this): correct gradient."""

    @staticmethod
    def forward(ctx, x):
        lse = torch.logsumexp(x.float(), -1, keepdim=True).to(x.dtype)
        ctx.save_for_backward(x, lse)
        return x - lse

    @staticmethod
    def backward(ctx, g):
        x, lse = ctx.saved_tensors
        return g - (x - lse).exp() * g.sum(-1, keepdim=True)


def test_float64_inputs_with_part_of_the_math_in_float32_are_measured_not_failed():
    x = torch.randn(6, 7, dtype=torch.float64, generator=_g(7))
    report = gradguard.check_op(_PartlyFloat32.apply, x, checks=("gradient",))
    assert report.passed, str(report)
    assert any(n.startswith("fn computes partly in float32 on float64 inputs") for n in report.notes), report.notes
    exact = gradguard.check_op(lambda x: torch.log_softmax(x, -1), x, checks=("gradient",))
    assert exact.passed and not any("float32" in n for n in exact.notes)


def test_shrink_candidates_never_pair_a_batch_with_a_cut_per_feature_tensor():
    # NOTE [Shrinking never mismatches shapes]: k04's heap corruption came from x (1, 12) beside a weight cut to (1,)
    from gradguard.checks.regimes import shrink_candidates
    from gradguard.checks.torch_ops import TorchBackend

    B = TorchBackend()
    shapes = lambda cands: [[tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in c] for c in cands]
    w, bias = torch.randn(12), torch.randn(12)
    assert shrink_candidates(B, [torch.randn(1, 12), w, bias]) == []  # batch already 1: the weight is not the batch
    assert shapes(shrink_candidates(B, [torch.randn(12, 12), w, bias, 1e-5])) == [[(1, 12), (12,), (12,), 1e-5]]
    labels = torch.tensor([0, 2, 1, 2])
    assert shapes(shrink_candidates(B, [torch.randn(4, 3), labels])) == [[(1, 3), (1,)]]  # per-sample: cut with x
