"""Argument regimes: check_op varies the op's own non-tensor arguments (dim, flags, ignore_index, bounds, eps,
offsets). On the catalogue in benchmarks/argbugs every argument-dependent mutant is caught, the report names the
argument value the failure needs, and every correct op passes in four dtypes, with and without a reference."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

import gradguard
from gradguard import InvalidArgument

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "argbugs"))
from catalogue import CASES  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
BY_NAME = {c.name: c for c in CASES}


def _args(case, dtype=torch.float32):
    return case.make(dtype, torch.Generator().manual_seed(0))


def test_catalogue_has_twenty_argument_dependent_bugs():
    assert len(CASES) >= 20


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_mutant_is_caught_and_the_argument_named(name):
    case = BY_NAME[name]
    args = _args(case)
    # the bug does not show on the call as given: only varying the op's arguments finds it
    assert gradguard.check_op(case.mutant, *args, reference=case.reference, checks=("gradient",)).passed
    report = gradguard.check_op(case.mutant, *args, reference=case.reference)
    assert not report.passed
    assert any(f"fails only with {case.needs}" in f.message or f"fails only with rows hitting {case.needs}" in f.message
               or f"on both sides of {case.needs}" in f.message for f in report.failures), \
        [f.message for f in report.failures]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_correct_op_passes_in_every_dtype(name, dtype):
    case = BY_NAME[name]
    args = _args(case, dtype)
    for reference in (case.reference, None):
        report = gradguard.check_op(case.correct, *args, reference=reference)
        assert report.passed, str(report)


def test_vary_leaves_an_argument_as_given():
    case = BY_NAME["logsumexp_dim"]
    report = gradguard.check_op(case.mutant, *_args(case), reference=case.reference, vary={"dim": False})
    assert report.passed, str(report)
    assert not [c for c in report.checks if c.check == "regime.reduction_dim" and c.status != "skip"]


def test_vary_takes_the_values_to_try():
    case = BY_NAME["rope_offset"]
    report = gradguard.check_op(case.mutant, *_args(case), reference=case.reference, vary={"offset": [7]})
    assert not report.passed
    assert any("fails only with `offset=7`" in f.message for f in report.failures)


def test_vary_with_a_bad_name_or_value_is_a_clear_error():
    case = BY_NAME["logsumexp_dim"]
    with pytest.raises(InvalidArgument, match=r"vary names 'axis'.*its arguments are: dim"):
        gradguard.check_op(case.correct, *_args(case), vary={"axis": False})
    with pytest.raises(InvalidArgument, match=r"vary\['dim'\] must be False .* got str 'no'"):
        gradguard.check_op(case.correct, *_args(case), vary={"dim": "no"})


def _only_last_dim(x, dim=-1):
    if dim not in (-1, x.ndim - 1):
        raise ValueError(f"only the last dim is supported, got dim={dim}")
    return torch.logsumexp(x, dim)


def test_an_argument_value_the_op_rejects_is_skipped_and_listed():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    report = gradguard.check_op(_only_last_dim, x, reference=lambda x, dim=-1: torch.logsumexp(x, dim))
    assert report.passed, str(report)
    skipped = [c.detail for c in report.checks if c.check == "regime.reduction_dim" and c.status == "skip"]
    assert any(d.startswith("fn rejects `dim=0` (ValueError") for d in skipped), skipped


class _AddNorm(torch.autograd.Function):
    """Fused add + RMS norm returning (normed, residual): two outputs, both requiring grad."""

    @staticmethod
    def forward(ctx, x, r, w):
        h = x + r
        rstd = (h.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()
        ctx.save_for_backward(h, w, rstd)
        return h * rstd * w, h

    @staticmethod
    def backward(ctx, g, g_res):
        h, w, rstd = ctx.saved_tensors
        hhat = h * rstd
        gw = g * w
        dh = rstd * (gw - hhat * (gw * hhat).mean(-1, keepdim=True)) + g_res
        return dh, dh, (g * hhat).sum(0)


def _add_norm_ref(x, r, w):
    h = x + r
    return h * (h.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * w, h


def test_two_output_op_with_reference_survives_grad_subset():
    g = torch.Generator().manual_seed(2)
    x, r, w = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g), 1 + 0.1 * torch.randn(6, generator=g)
    report = gradguard.check_op(_AddNorm.apply, x, r, w, reference=_add_norm_ref)
    assert report.passed, str(report)
    assert [c.status for c in report.checks if c.check == "regime.grad_subset"] == ["pass"] * 3


def test_partial_reference_is_compared_on_what_it_returns():
    g = torch.Generator().manual_seed(3)
    x, r, w = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g), 1 + 0.1 * torch.randn(6, generator=g)
    normed_only = lambda x, r, w: _add_norm_ref(x, r, w)[0]  # noqa: E731
    report = gradguard.check_op(_AddNorm.apply, x, r, w, reference=normed_only)
    assert report.passed, str(report)
    assert any(c.check == "gradient.reference" and c.status == "pass" for c in report.checks)
    wrong = lambda x, r, w: 2 * _add_norm_ref(x, r, w)[0]  # noqa: E731
    assert "forward.reference" in gradguard.check_op(_AddNorm.apply, x, r, w, reference=wrong).failed_checks()


def test_budget_lists_what_it_did_not_reach_as_skipped():
    case = BY_NAME["logsumexp_dim"]
    report = gradguard.check_op(case.correct, *_args(case), reference=case.reference, budget=1e-9)
    assert report.passed
    spent = [c for c in report.checks if c.status == "skip" and "budget spent (budget=1e-09)" in c.detail]
    assert {c.check for c in spent} >= {"regime.reduction_dim", "regime.noncontiguous", "mutation", "composition"}
    assert not [c for c in report.checks if c.check.startswith("regime.") and c.status == "pass"]
    # the given inputs always get the gradient suite
    assert any(c.check == "gradient.numerical" and c.status == "pass" for c in report.checks)
    with pytest.raises(InvalidArgument, match="budget must be a positive number of seconds or 'quick'"):
        gradguard.check_op(case.correct, *_args(case), budget=0)


def test_quick_budget_runs_the_argument_regimes_first():
    case = BY_NAME["roll_shift"]
    # "quick" is a share of the wall time the given inputs took: a machine busy with other tests can stall the one
    # regime that finds this bug past it. Ordering is what is tested: wrong, every attempt misses it.
    for _attempt in range(3):
        report = gradguard.check_op(case.mutant, *_args(case), reference=case.reference, budget="quick")
        if any("fails only with `shift=3`" in f.message for f in report.failures):
            break
    assert not report.passed and any("fails only with `shift=3`" in f.message for f in report.failures), str(report)


def test_an_argument_strategy_with_nothing_to_vary_is_listed_as_skipped_with_why():
    report = gradguard.check_op(lambda x, dim: torch.logsumexp(x, dim), torch.randn(3, 4, dtype=torch.float64), 1)
    skipped = {c.check: c.detail for c in report.checks if c.status == "skip"}
    assert skipped["regime.flags"] == "fn takes no bool argument"
    assert skipped["regime.thresholds"] == "fn takes no float bound/threshold/eps argument"
    assert "regime.reduction_dim" not in skipped  # `dim` is varied
