"""check_op does less work where the answer cannot change (issue 15: time within reach of gradcheck's).

Each shortcut is checked two ways: it is taken (fewer calls of the op, a note in the report), and what it
skips still catches what it was there for (a non-repeatable backward, a write into the producer's output,
a bug that only the skipped regime's inputs show)."""

from __future__ import annotations

import numpy as np
import torch

import gradguard
from gradguard.checks import runs as num


class _Counted:
    """fn with a count of its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def _calls(fn, *inputs, **options) -> int:
    counted = _Counted(fn)
    gradguard.check_op(counted, *inputs, **options)
    return counted.calls


# ---- the K cotangents at once: the same sums as one at a time ----------------------------------------
def test_stacked_cotangents_give_the_same_sums_bit_for_bit():
    rng = np.random.default_rng(0)
    for shapes in [[()], [(10,)], [(4, 8)], [(6, 5), ()], [(3, 1, 9), (129,)], [(37, 41)]]:
        U = [[rng.standard_normal(s) for s in shapes] for _ in range(3)]
        vs = [rng.standard_normal(s) * 10.0 ** rng.uniform(-6, 6, s) for s in shapes]
        vs[0] = -np.abs(vs[0])  # a negative first term: -0.0 + ... must not differ from Python's 0 + ...
        cot = num.Cotangents(U)
        assert cot.fits(vs)
        assert cot.dot(vs).tolist() == [num.dot(u, vs) for u in U]
        assert cot.absdot(vs).tolist() == [num.absdot(u, vs) for u in U]
    cot = num.Cotangents([[np.ones(3)]])
    assert not cot.fits([np.ones(4)]) and not cot.fits([np.ones(3), np.ones(3)])


# ---- regimes with the same inputs run once ----------------------------------------------------------
def _xsin(x):
    return x * torch.sin(x)


class _WrongOnOneElement(torch.autograd.Function):
    """x * 3 with a backward that drops the factor when the input has a single element (a size-1 branch)."""

    @staticmethod
    def forward(ctx, x):
        ctx.n = x.numel()
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g if ctx.n == 1 else g * 3


def test_a_regime_with_the_inputs_of_an_earlier_one_takes_its_result():
    x = torch.randn(10, generator=torch.Generator().manual_seed(0))
    # on a 1-D input of 10 elements, batch_size (10 -> 1, 10 -> 16) and feature_dim (10 -> 1, 10 -> 16) coincide
    both = _calls(_xsin, x, regimes=["batch_size", "feature_dim"])
    assert both == _calls(_xsin, x, regimes=["batch_size"])
    report = gradguard.check_op(_xsin, x, regimes=["batch_size", "feature_dim"])
    assert report.passed
    status = {(c.check, c.detail): c.status for c in report.checks if c.check.startswith("regime.")}
    assert status == {
        ("regime.batch_size", "leading dimension 10 -> 1 on every input that has it"): "pass",
        ("regime.batch_size", "leading dimension 10 -> 16 on every input that has it"): "pass",
        ("regime.feature_dim", "last dimension 10 -> 1 (size 1) on every float input that has it"): "pass",
        ("regime.feature_dim", "last dimension 10 -> 16 (a power of two) on every float input that has it"): "pass",
    }
    assert ("regime.feature_dim (last dimension 10 -> 1 (size 1) on every float input that has it) has the same "
            "inputs as regime.batch_size (leading dimension 10 -> 1 on every input that has it): not run again, "
            "its result is that run's") in report.notes


def test_the_regime_that_takes_an_earlier_result_still_fails_with_it():
    x = torch.randn(10, generator=torch.Generator().manual_seed(1))
    report = gradguard.check_op(_WrongOnOneElement.apply, x, regimes=["batch_size", "feature_dim"])
    assert report.failed_checks() == {"regime.batch_size", "regime.feature_dim"}
    (size1,) = [f for f in report.failures if f.check == "regime.feature_dim"]
    assert size1.regime == "feature_dim"
    assert size1.message.endswith("(last dimension 10 -> 1 (size 1) on every float input that has it)")
    assert "leading dimension" not in size1.message


def test_regimes_with_other_inputs_all_run():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(2))
    report = gradguard.check_op(_xsin, x, regimes=["batch_size", "feature_dim"])
    assert not any("not run again" in n for n in report.notes)
    assert _calls(_xsin, x, regimes=["batch_size", "feature_dim"]) > _calls(_xsin, x, regimes=["batch_size"])


# ---- composition: the private-copy run only when the producer's output changed -----------------------
def test_composition_runs_the_private_copy_only_when_the_producer_output_changed():
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(3))
    # four producers, one input: one run each for an op that leaves its input alone (was two)
    extra = _calls(_xsin, x, checks=("gradient", "composition")) - _calls(_xsin, x, checks=("gradient",))
    assert extra == 4


class _WritesInputInBackward(torch.autograd.Function):
    """x * 2 whose backward scribbles over its (saved) input through .data: a silent write, in backward only."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        x.data.fill_(0.5)
        return g * 2


def test_a_write_into_the_producer_output_during_backward_is_still_caught():
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(4))
    report = gradguard.check_op(_WritesInputInBackward.apply, x, checks=("gradient", "composition"))
    failed = report.failed_checks()
    assert {"composition.exp", "composition.sigmoid", "composition.softmax"} <= failed
    comp = next(f for f in report.failures if f.check == "composition.exp")
    assert comp.message == "gradient through exp(x) -> op is wrong: running the op on exp's output directly changes exp's gradient"


# ---- one graph for several cotangents once its backward repeated ------------------------------------
# (a backward that is right only once: test_check_op.py's test_backward_right_only_once_*)
def test_a_repeatable_backward_shares_one_graph_among_the_cotangents():
    x = torch.randn(6, generator=torch.Generator().manual_seed(7))
    # given inputs, no regimes, gradient checks only: the op's dtype run, its float64 run, the effective-precision
    # probes (2), the linearity probes (2) and 2 x 3 finite-difference directions (a correct op never pays for the
    # 2 x 6 columns of the full Jacobian: NOTE [Regimes use directions]); one forward per run, not per cotangent
    assert _calls(_xsin, x, checks=("gradient",), regimes=[]) == 1 + 1 + 2 + 2 + 6


# ---- cheaper conversions and comparisons: the same numbers ------------------------------------------
def test_rounding_to_float32_matches_torch_cast():
    from gradguard.checks.torch_ops import TORCH

    rng = np.random.default_rng(8)
    values = np.concatenate([rng.standard_normal(1000) * 10.0 ** rng.uniform(-45, 39, 1000),
                             [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-46, -1e-40, 3.4e38, 3.5e38, 1 + 2.0**-24]])
    expected = torch.from_numpy(values).to(torch.float32).to(torch.float64).numpy()
    got = TORCH.round_to(values, "float32")
    assert np.array_equal(got, expected, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(expected))
    assert TORCH.round_to(values, "float64") is not values and np.array_equal(TORCH.round_to(values, "float64"), values, equal_nan=True)


def test_compare_reads_non_finite_values_as_before():
    ok = num.compare(np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-9]), 1e-8)
    assert ok.ok and ok.max_abs > 0
    bad = num.compare(np.array([1.0, 5.0]), np.array([1.0, 2.0]), 0.5)
    assert (bad.ok, bad.index, bad.got, bad.expected, bad.max_abs, bad.max_rel) == (False, (1,), 5.0, 2.0, 3.0, 1.5)
    nan_same = num.compare(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), 0.0)
    assert nan_same.ok
    inf_vs_finite = num.compare(np.array([np.inf, 1.0]), np.array([3.0, 1.0]), 1.0)
    assert not inf_vs_finite.ok and inf_vs_finite.index == (0,) and inf_vs_finite.max_abs == np.inf
    assert num.compare(np.zeros(0), np.zeros(0), 0.0).ok
