"""check_op on the project's own correct and buggy ops (examples/ops/kernels.py), reports and bad input."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
import torch

import gradguard
from gradguard import InvalidArgument
from gradguard.testing import assert_op

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "ops"))
import kernels as K  # noqa: E402


def _cast(args, dtype):
    return [a.to(dtype) if a.is_floating_point() else a for a in args]


# ---- no false alarms ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(K.CORRECT))
@pytest.mark.parametrize("with_reference", [True, False])
def test_correct_ops_pass(name, dtype, with_reference):
    fn, ref, make = K.CORRECT[name]
    report = gradguard.check_op(fn, *make(dtype), reference=ref if with_reference else None)
    assert report.passed, str(report)
    assert report.failures == []


@pytest.mark.parametrize("name", ["xsin", "softmax", "layer_norm", "cross_entropy", "embedding"])
def test_correct_ops_pass_in_bfloat16_against_reference(name):
    fn, ref, make = K.CORRECT[name]
    report = gradguard.check_op(fn, *_cast(make(), torch.bfloat16), reference=ref)
    assert report.passed, str(report)
    assert "gradient.reference" in {c.check for c in report.checks if c.status == "pass"}


@pytest.mark.parametrize(
    "op",
    [
        lambda x: torch.tanh(x) * x,
        lambda x: torch.nn.functional.gelu(x),
        lambda x: torch.log_softmax(x, dim=-1),
        lambda x: (x @ x.T).sum(dim=0),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_builtin_ops_pass_without_reference(op, dtype):
    x = torch.randn(5, 6, dtype=dtype, generator=torch.Generator().manual_seed(7))
    assert gradguard.check_op(op, x).passed


def test_module_is_accepted_and_named():
    lin = torch.nn.Linear(6, 3)
    report = gradguard.check_op(lin, torch.randn(4, 6))
    assert report.passed, str(report)
    assert report.op == "Linear"


# ---- every buggy example classified -------------------------------------------------------------------
EXPECTED = {
    # name: (checks that must fail with a reference, checks that must fail without one)
    "xsin_wrong": ({"gradient.numerical", "gradient.reference"}, {"gradient.numerical"}),
    "xsin_squared_upstream": ({"gradient.cotangent_linearity", "gradient.numerical"}, {"gradient.cotangent_linearity"}),
    "xcos_consistent": ({"forward.reference", "gradient.reference"}, None),  # consistent bug: invisible without reference
    "softmax_no_cross_term": ({"gradient.numerical", "gradient.reference"}, {"gradient.numerical"}),
    "softmax_naive": ({"regime.large_magnitude"}, {"regime.large_magnitude"}),
    "layer_norm_no_mean_term": ({"gradient.numerical", "gradient.reference"}, {"gradient.numerical"}),
    "layer_norm_eps_dropped": ({"regime.near_constant_rows"}, {"regime.near_constant_rows"}),
    "cross_entropy_ignore_bug": ({"regime.sentinel_indices"}, {"regime.sentinel_indices"}),
    "embedding_overwrite": ({"regime.repeated_indices"}, {"regime.repeated_indices"}),
    "scale_assumes_contiguous": ({"regime.noncontiguous"}, {"regime.noncontiguous"}),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(K.BUGGY))
def test_buggy_ops_fail_with_the_right_checks(name, dtype):
    fn, ref, make = K.BUGGY[name]
    with_ref, without_ref = EXPECTED[name]
    report = gradguard.check_op(fn, *make(dtype), reference=ref)
    assert not report.passed
    assert with_ref <= report.failed_checks(), str(report)
    report = gradguard.check_op(fn, *make(dtype))
    if name == "softmax_naive" and dtype == torch.float64:
        # exp overflows float64 too at x1000: outputs NaN in float64 are outside what can be judged without a
        # reference (a skipped regime, as for log-probabilities x1000); float32 overflows at x59 and float64 not
        (large,) = [c for c in report.checks if c.check == "regime.large_magnitude" and "x1000" not in c.detail][-1:]
        assert large.status == "skip" and "domain" in large.detail, str(report)
    elif without_ref is None:
        assert report.passed, "a bug consistent in forward and backward needs a reference to be seen"
    else:
        assert without_ref <= report.failed_checks(), str(report)


def test_regime_only_bugs_pass_on_the_given_inputs():
    # the bug does not show on the inputs as given: only the regime probing finds it
    for name in ("softmax_naive", "cross_entropy_ignore_bug", "embedding_overwrite", "scale_assumes_contiguous"):
        fn, ref, make = K.BUGGY[name]
        assert gradguard.check_op(fn, *make(), reference=ref, checks=("gradient",)).passed, name


def test_seed_003_xsin_hand_written_backward():
    x = torch.randn(10, generator=torch.Generator().manual_seed(0))
    assert gradguard.check_op(K.xsin, x).passed
    bad = gradguard.check_op(K.xsin_wrong, x)
    (numerical,) = [f for f in bad.failures if f.check == "gradient.numerical"]
    assert numerical.regime == "given" and numerical.input == "x"
    # the worst element is named, with the backward's and the finite difference's values
    assert numerical.where.startswith("x[") and "finite differences" in numerical.where
    assert numerical.max_abs_err > 1e-2
    # shrunk to a single element that still fails
    assert numerical.repro.splitlines()[0].startswith("x = torch.tensor([")
    assert numerical.repro.splitlines()[0].count(",") == 1  # one value and the dtype


def test_failures_carry_a_minimal_reproducer():
    fn, ref, make = K.BUGGY["cross_entropy_ignore_bug"]
    report = gradguard.check_op(fn, *make(), reference=ref)
    failure = next(f for f in report.failures if f.check == "regime.sentinel_indices")
    assert failure.regime == "sentinel_indices"
    assert "ignore_index=-100" in failure.message
    # a batch of one row whose target is the sentinel is a batch the reference cannot handle (NaN mean of
    # nothing): not a reproducer, so the repro keeps the regime's batch, sentinel included
    assert "target = torch.tensor([-100, " in failure.repro
    assert failure.max_abs_err > 0 and failure.max_rel_err > 0


# ---- mutation, aliasing, composition with plain torch ops ---------------------------------------------
class _DataWriteCE(torch.autograd.Function):
    """Stores its gradient into its input through .data: the Liger pattern without Triton."""

    @staticmethod
    def forward(ctx, x):
        logp = torch.log_softmax(x, dim=-1)
        loss = -logp[:, 0].mean()
        grad = logp.exp()
        grad[:, 0] -= 1
        x.data.copy_(grad / x.shape[0])
        ctx.save_for_backward(x.detach())
        return loss

    @staticmethod
    def backward(ctx, g):
        (gx,) = ctx.saved_tensors
        return gx * g


class _ScalesSavedInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(2 * x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (d,) = ctx.saved_tensors
        d.data.mul_(g)  # silent in-place on a saved tensor: right once, wrong on every later backward
        return d


class _WritesGradOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g.mul_(3)


class _ReturnsAlias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.detach()

    @staticmethod
    def backward(ctx, g):
        return g


def _ce_ref(x):
    return -torch.log_softmax(x, dim=-1)[:, 0].mean()


def test_silent_input_write_and_composition():
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    report = gradguard.check_op(_DataWriteCE.apply, x, reference=_ce_ref, checks=("gradient", "mutation", "composition"))
    failed = report.failed_checks()
    assert {"mutation.silent_input_write", "composition.exp", "composition.sigmoid", "composition.softmax"} <= failed
    assert "gradient.numerical" not in failed and "gradient.reference" not in failed  # the op alone is right
    write = next(f for f in report.failures if f.check == "mutation.silent_input_write")
    assert write.message == "the op's forward changed the bytes of input x (float32[4, 5]) without bumping its version (0)"
    comp = next(f for f in report.failures if f.check == "composition.softmax")
    assert "bytes changed, version unchanged" in comp.message
    # the same op fed a private copy is clean
    clean = gradguard.check_op(lambda x: _DataWriteCE.apply(x.clone()), x, reference=_ce_ref)
    assert clean.passed, str(clean)


def test_backward_that_mutates_its_saved_tensor():
    report = gradguard.check_op(_ScalesSavedInBackward.apply, torch.randn(6), checks=("mutation",))
    assert report.failed_checks() == {"mutation.backward_not_repeatable"}


def test_backward_right_only_once_as_the_reference_gets_a_graph_per_cotangent():
    # its second backward through one graph differs, so every cotangent gets a fresh graph: no false alarm
    report = gradguard.check_op(lambda x: x * x, torch.randn(6), reference=_ScalesSavedInBackward.apply, regimes=[])
    assert report.passed, str(report)
    assert {c.check: c.status for c in report.checks if c.regime == "given"}["gradient.reference"] == "pass"


def test_backward_right_only_once_fails_only_the_mutation_check():
    report = gradguard.check_op(_ScalesSavedInBackward.apply, torch.randn(6), reference=lambda x: x * x, regimes=[])
    assert report.failed_checks() == {"mutation.backward_not_repeatable"}


def test_backward_that_writes_grad_output():
    report = gradguard.check_op(_WritesGradOutput.apply, torch.randn(6), checks=("mutation",))
    assert "mutation.grad_output_write" in report.failed_checks()


def test_output_aliasing_input():
    report = gradguard.check_op(_ReturnsAlias.apply, torch.randn(6), checks=("aliasing",))
    (f,) = report.failures
    assert f.check == "aliasing.output_aliases_input"
    assert f.message == "output (float32[6]) shares memory with input x, and autograd does not know it is a view"
    # a real view is fine
    assert gradguard.check_op(lambda x: x.view(2, 3), torch.randn(6), checks=("aliasing",)).passed


def test_declared_inplace_write_is_a_warning_not_a_failure():
    def op(x):
        y = x * 1.0
        return y.mul_(2)  # in place on an intermediate: fine

    assert gradguard.check_op(op, torch.randn(5)).passed


def test_user_inputs_are_never_modified():
    x = torch.randn(4, 5)
    before = x.clone()
    gradguard.check_op(_DataWriteCE.apply, x, checks=("mutation", "composition"))
    assert torch.equal(x, before) and x._version == 0


# ---- report views -------------------------------------------------------------------------------------
def test_report_renders_everywhere():
    fn, ref, make = K.BUGGY["xsin_squared_upstream"]
    report = gradguard.check_op(fn, *make(), reference=ref)
    text = str(report)
    assert text.startswith("gradguard.check_op FAILED: xsin_squared_upstream")
    assert "FAIL gradient.cotangent_linearity [given] x:" in text
    d = report.to_dict()
    assert d["passed"] is False and d["format_version"] == 1
    assert {f["check"] for f in d["failures"]} == report.failed_checks()
    assert d["elapsed_s"] == report.elapsed_s > 0
    document = json.loads(report.to_json())
    assert (document["tool"], document["report"], document["op"]) == ("gradguard", "check_op", d["op"])
    assert document["findings"] == json.loads(json.dumps(d["failures"] + d["warnings"], default=str))
    bundle = report._repr_mimebundle_()
    assert bundle["text/plain"] == text
    assert "<table>" in bundle["text/html"] and "gradient.cotangent_linearity" in bundle["text/html"]
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(report)
    assert "gradient.cotangent_linearity" in console.export_text()
    assert repr(report).startswith("<OpReport xsin_squared_upstream: FAILED")


def test_passing_report_lists_checks_and_time():
    report = gradguard.check_op(K.softmax, torch.randn(3, 4), reference=K.softmax_ref)
    assert "PASSED" in report.summary() and f"{report.elapsed_s:.2f} s" in report.summary()
    statuses = {c.check: c.status for c in report.checks}
    assert statuses["gradient.numerical"] == "pass" and statuses["regime.channels_last"] == "skip"


# ---- assert_op ----------------------------------------------------------------------------------------
def test_assert_op():
    x = torch.randn(8)
    assert assert_op(K.xsin, x, reference=K.xsin_ref).passed
    with pytest.raises(AssertionError) as info:
        assert_op(K.xsin_wrong, x, reference=K.xsin_ref)
    assert "gradient.numerical" in str(info.value) and "FAILED" in str(info.value)


# ---- bad input ----------------------------------------------------------------------------------------
def _message(excinfo):
    return str(excinfo.value)


def test_bad_arguments_name_the_argument():
    x = torch.randn(3)
    with pytest.raises(InvalidArgument) as e:
        gradguard.check_op(K.xsin, [1.0, 2.0])  # passed through like gradcheck, but nothing to differentiate
    assert _message(e) == (
        "check_op: inputs has no floating-point tensor (got x: list [1.0, 2.0]), so there is no gradient to "
        "check. Pass at least one floating-point tensor input (for example x.float())."
    )
    with pytest.raises(InvalidArgument) as e:
        gradguard.check_op(K.embedding, torch.tensor([0, 1]), torch.tensor([[1, 2], [3, 4]]))
    assert _message(e) == (
        "check_op: inputs has no floating-point tensor (got idx: int64[2], weight: int64[2, 2]), so there is no "
        "gradient to check. Pass at least one floating-point tensor input (for example x.float())."
    )
    with pytest.raises(InvalidArgument) as e:
        gradguard.check_op(lambda x: (x > 0).long(), x)
    assert _message(e) == (
        "check_op: fn returned no differentiable tensor output (got output: int64[3] (does not require grad)). "
        "check_op audits gradients, so fn must return at least one floating-point tensor computed from its "
        "inputs with autograd on; did it detach its result or run under torch.no_grad()?"
    )
    with pytest.raises(InvalidArgument) as e:
        gradguard.check_op(K.xsin, x, reference=lambda x: (x * torch.sin(x)).sum())
    assert _message(e) == (
        "check_op: reference returned output with shape [] but fn returned shape [3]; the reference must "
        "compute the same function as fn (same outputs, same shapes)."
    )
    with pytest.raises(InvalidArgument) as e:
        gradguard.check_op(K.xsin, x, tolerance=1e-3)
    assert "unknown option 'tolerance'" in _message(e) and "kwargs={...}" in _message(e)
    with pytest.raises(InvalidArgument) as e:
        gradguard.check_op("softmax", x)
    assert _message(e).startswith("check_op: fn must be callable") and _message(e).endswith("got str.")
    with pytest.raises(InvalidArgument) as e:
        gradguard.check_op(K.xsin, x, regimes=["huge"])
    assert "regimes contains 'huge'" in _message(e)
    with pytest.raises(InvalidArgument) as e:
        gradguard.check_op(K.xsin)
    assert _message(e).startswith("check_op: no inputs given")
    assert issubclass(InvalidArgument, TypeError)


# ---- kinks: the reference's convention decides -------------------------------------------------------
class _Relu(torch.autograd.Function):
    ge = False

    @classmethod
    def forward(cls, ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved_tensors
        return g * ((x >= 0) if cls.ge else (x > 0)).to(g.dtype)


class _ReluGe(_Relu):
    ge = True  # gradient 1 at exactly 0, where torch.relu's convention is 0: another valid subgradient


class _ReluTwoAtZero(_Relu):
    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.where(x == 0, 2.0, (x > 0).to(g.dtype))  # 2 at 0: outside the subgradient [0, 1]


def test_kink_convention_is_judged_by_the_reference():
    x = torch.randn(12, generator=torch.Generator().manual_seed(3))
    assert gradguard.check_op(_Relu.apply, x, reference=torch.relu).passed
    # the op's other valid choice at the kink is accepted, with a note
    report = gradguard.check_op(_ReluGe.apply, x, reference=torch.relu)
    assert report.passed, str(report)
    assert any("another valid subgradient" in n for n in report.notes)
    # a value outside the subgradient is not
    report = gradguard.check_op(_ReluTwoAtZero.apply, x, reference=torch.relu)
    assert report.failed_checks() == {"regime.kinks"}
    (f,) = report.failures
    assert "[gradient.reference]" in f.message and f.regime == "kinks"
    # without a reference there is no convention to compare with: no false alarm
    assert gradguard.check_op(_ReluGe.apply, x).passed


def test_clamp_limits_from_kwargs_become_kink_points():
    x = torch.randn(9, generator=torch.Generator().manual_seed(5))

    def clamp(x, min=-0.5, max=0.5):
        return torch.clamp(x, min, max)

    report = gradguard.check_op(clamp, x, reference=torch.clamp, kwargs=dict(min=-0.5, max=0.5))
    assert report.passed, str(report)
    kinks = next(c for c in report.checks if c.check == "regime.kinks")
    assert "-0.5, 0, 0.5" in kinks.detail


def test_op_without_float64_support_gets_a_note_not_a_failure():
    report = gradguard.check_op(lambda x: torch.sin(x.float()), torch.randn(6))
    assert report.passed
    assert "fn returned float32 outputs for float64 inputs; float64 checks skipped" in report.notes
    # finite differences then run in the op's own float32, with a float32 step and tolerance
    assert {c.check: c.status for c in report.checks}["gradient.numerical"] == "pass"


# ---- torch.library custom ops -------------------------------------------------------------------------
@torch.library.custom_op("gradguard_test::scaled_tanh", mutates_args=())
def _scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@_scaled_tanh.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


def _scaled_tanh_backward(ctx, g):
    (x,) = ctx.saved_tensors
    return g * ctx.scale * (1 - torch.tanh(x) ** 2), None


_scaled_tanh.register_autograd(_scaled_tanh_backward, setup_context=_setup)


def test_torch_library_op_with_kwargs():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(11))
    report = gradguard.check_op(torch.ops.gradguard_test.scaled_tanh, x, kwargs=dict(scale=1.5),
                                reference=lambda x, scale: torch.tanh(x) * scale)
    assert report.passed, str(report)
    assert report.inputs == ["inputs[0]: float32[3, 4] (differentiated)"]


def test_channels_last_layout_bug():
    x = torch.randn(2, 3, 2, 2, generator=torch.Generator().manual_seed(12))
    report = gradguard.check_op(K.scale_assumes_contiguous, x, reference=K.scale_ref, checks=("regime",))
    assert {"regime.channels_last", "regime.noncontiguous"} <= report.failed_checks()
    fixed = gradguard.check_op(K.CORRECT["scale"][0], x, reference=K.scale_ref, checks=("regime",))
    assert fixed.passed, str(fixed)
