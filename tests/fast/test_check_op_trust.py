"""check_op on correct ops that used to raise false alarms or crash (issue 15, defects 1-5)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import gradguard


def _g(seed):
    return torch.Generator().manual_seed(seed)


class _WritesGradOutput(torch.autograd.Function):
    """Correct gradient, but the backward scales grad_output in place."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g.mul_(x.cos())


def test_backward_writing_grad_output_does_not_corrupt_the_audit():
    report = gradguard.check_op(_WritesGradOutput.apply, torch.randn(6, dtype=torch.float64, generator=_g(0)))
    # the write itself is reported; nothing else (it used to corrupt check_op's own cotangents: 9 failures)
    assert report.failed_checks() == {"mutation.grad_output_write"}, str(report)


class _Float32Math(torch.autograd.Function):
    """Accepts float64, computes in float32 (what a Triton kernel with tl.float32 accumulators does)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.float().sin().to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (g.float() * x.float().cos()).to(x.dtype)


def test_float32_math_on_float64_inputs_is_measured_not_failed():
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(40, dtype=dtype, generator=_g(1))
        for ref in (torch.sin, None):
            report = gradguard.check_op(_Float32Math.apply, x, reference=ref)
            assert report.passed, str(report)
            assert any("fn computes in float32 on float64 inputs" in n for n in report.notes)


class _NoFloat64Backward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        {torch.float32: 1.0}[g.dtype]  # a kernel table without a float64 entry
        return g * x.cos()


class _BackwardRaises(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        raise ValueError("grid too small")


def test_failures_of_the_op_are_findings():
    x = torch.randn(6, generator=_g(2))
    report = gradguard.check_op(_NoFloat64Backward.apply, x, reference=torch.sin)
    assert report.passed, str(report)
    assert any("backward failed on float64 inputs (KeyError" in n for n in report.notes)
    report = gradguard.check_op(_BackwardRaises.apply, x)
    assert report.failed_checks() == {"op.raised"}
    (f,) = report.failures
    assert f.message == "fn's backward raised ValueError: grid too small (inputs: float32)"
    assert f.where.endswith("in backward") and "test_check_op_trust.py" in f.where


def test_called_like_gradcheck():
    x = torch.randn(4, 3, generator=_g(3))
    assert gradguard.check_op(lambda x, t: x / t, x, 2.0).passed
    assert gradguard.check_op(lambda x, a, n, flag, shape: (x * n if flag else x).reshape(shape) if a is None else x,
                              x, None, 3, True, (3, 4)).passed
    report = gradguard.check_op(lambda x, t: x / t, x, 2.0)
    assert report.inputs == ["x: float32[4, 3] (differentiated)", "t: float 2.0"]


def test_no_false_alarms_on_zero_dim_saturated_and_domain_edges():
    assert gradguard.check_op(torch.sin, torch.tensor(0.5)).passed
    x = torch.randn(4, generator=_g(4))
    assert gradguard.check_op(lambda x, t: x / t, x, torch.tensor(0.7)).passed
    # confident logits: gradients of 1e-40 and less, judged with a floor from the input/output scales
    logits = torch.randn(4, 6, dtype=torch.float64, generator=_g(5)) * 80
    sm = lambda x: torch.softmax(x, -1)  # noqa: E731
    assert gradguard.check_op(sm, logits, reference=lambda x: torch.exp(torch.log_softmax(x, -1))).passed
    # kl_div with a target exactly 0: the edge of the domain is a note, not a gradient failure
    target = torch.rand(4, 5, generator=_g(6))
    target[0, 0] = 0
    logp = torch.randn(4, 5, generator=_g(7)).log_softmax(-1)
    report = gradguard.check_op(lambda x, t: F.kl_div(x, t, reduction="sum"), logp, target)
    assert report.passed, str(report)
    assert any("leave fn's domain" in n for n in report.notes)


def test_regime_the_reference_cannot_handle_is_not_applicable():
    ce = lambda x, y: F.cross_entropy(x, y, ignore_index=-100)  # noqa: E731
    logits = torch.randn(1, 5, generator=_g(8))
    target = torch.tensor([2])
    report = gradguard.check_op(ce, logits, target, reference=ce, kwargs={})
    assert report.passed, str(report)


def test_float16_and_bfloat16_have_no_false_alarms():
    x = torch.randn(6, 10, generator=_g(9)) * 8  # confident logits
    y = torch.randint(0, 10, (6,), generator=_g(10))
    for dtype in (torch.float16, torch.bfloat16):
        report = gradguard.check_op(lambda x, y: F.cross_entropy(x, y), x.to(dtype), y, reference=F.cross_entropy)
        assert report.passed, str(report)


# ---- torch.library ops: opcheck folded in ------------------------------------------------------------
@torch.library.custom_op("gradguard_trust::undeclared_write", mutates_args=())
def _undeclared_write(x: torch.Tensor) -> torch.Tensor:
    x.add_(1.0)  # the schema says x is read-only
    return x * 2


@_undeclared_write.register_fake
def _(x):
    return torch.empty_like(x)


_undeclared_write.register_autograd(lambda ctx, g: g * 2, setup_context=lambda ctx, inputs, output: None)


def test_custom_op_runs_opcheck_in_the_same_report():
    report = gradguard.check_op(_undeclared_write, torch.randn(3, 4, generator=_g(11)),
                                checks=("gradient", "mutation"))
    assert report.op == "gradguard_trust::undeclared_write"
    assert report.root_cause.check == "opcheck.schema"
    assert report.root_cause.message == (
        "torch.library.opcheck test_schema failed: Argument x is not defined as mutable but was mutated")
    assert "mutation.input_write" not in {f.check for f in report.findings}  # not "declared"
    statuses = {c.check: c.status for c in report.checks}
    assert statuses["opcheck.faketensor"] == statuses["opcheck.autograd_registration"] == "pass"


def test_root_cause_leads_and_consequences_are_grouped():
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "ops"))
    import kernels as K

    fn, ref, make = K.BUGGY["xsin_wrong"]
    report = gradguard.check_op(fn, *make(), reference=ref)
    text = str(report).splitlines()
    # the header may wrap at 80 columns: the root cause follows the inputs and reference lines
    head = text.index("  root cause (first check failing on the simplest input):")
    assert head <= 4 and text[head - 1].startswith("     ref   :")
    assert text[head + 1].startswith("  FAIL gradient.numerical [given] x: backward of x disagrees")
    assert report.root_cause.check == "gradient.numerical"
    assert "  consequences and further failures (1):" in text
    assert any(line.startswith("     - FAIL gradient.reference [given] x:") for line in text)


def test_no_progress_output_when_stderr_is_not_a_terminal(capsys):
    gradguard.check_op(torch.sin, torch.randn(5, generator=_g(12)))
    out = capsys.readouterr()
    assert out.err == "" and out.out == ""


class _NoGradBranchCrashes(torch.autograd.Function):
    """Liger-Kernel#930's shape: a buffer only assigned when the input requires grad."""

    @staticmethod
    def forward(ctx, x, w):
        if x.requires_grad:
            grad_w = torch.zeros_like(w)
        out = x @ w.t()
        if grad_w is not None:  # noqa: F821  # UnboundLocalError when x does not require grad
            ctx.save_for_backward(x, w)
        return out

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x


def test_a_forward_that_crashes_under_no_grad_is_a_finding_not_a_crash():
    x, w = torch.randn(3, 4, dtype=torch.float64, generator=_g(8)), torch.randn(2, 4, dtype=torch.float64, generator=_g(9))
    report = gradguard.check_op(_NoGradBranchCrashes.apply, x, w, checks=("gradient",))
    assert report.failed_checks() == {"op.raised"}, str(report)
    root = report.root_cause
    assert root.message.startswith("fn's forward under torch.no_grad() raised UnboundLocalError")
    assert root.why.startswith("the op runs with autograd on but crashes with it off")


class _CrashesOnWeightOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            raise RuntimeError("grad_input buffer missing")
        return g @ w, g.t() @ x


def test_a_regime_the_reference_handles_and_the_op_crashes_on_is_a_failure():
    x, w = torch.randn(3, 4, dtype=torch.float64, generator=_g(10)), torch.randn(2, 4, dtype=torch.float64, generator=_g(11))
    ref = lambda x, w: x @ w.t()  # noqa: E731
    report = gradguard.check_op(_CrashesOnWeightOnly.apply, x, w, reference=ref, regimes=["grad_subset"])
    assert report.failed_checks() == {"regime.grad_subset"}, str(report)
    assert report.root_cause.message == ("fn's backward raised RuntimeError on inputs the reference handles (only "
                                         "w requires grad): grad_input buffer missing")
    # without a reference the op may simply not support it: a warning, not a failure
    loose = gradguard.check_op(_CrashesOnWeightOnly.apply, x, w, regimes=["grad_subset"])
    assert loose.passed and [f.check for f in loose.warnings] == ["regime.grad_subset"], str(loose)


class _MissingTerm(torch.autograd.Function):
    """x * sin(x) in float64 with a backward that forgets x * cos(x)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.sin(x)


def test_a_wrong_float64_backward_is_not_taken_for_lower_precision():
    # the precision probe used to predict the output's move from the op's own (wrong) backward, and so called a
    # float64 op "partly float32" and judged it with float32 tolerances
    report = gradguard.check_op(_MissingTerm.apply, torch.randn(3, 4, dtype=torch.float64, generator=_g(0)))
    assert report.root_cause.check == "gradient.numerical"
    assert report.root_cause.message.endswith("disagrees with central differences (full Jacobian)")
    assert not [n for n in report.notes if "float32" in n], report.notes


def test_large_inputs_get_one_probe_unless_asked():
    from gradguard.checks.audit import LARGE_INPUT_ELEMENTS

    x = torch.randn(LARGE_INPUT_ELEMENTS // 64 + 1, 64, generator=_g(3))
    fn = lambda a: torch.sin(a) * a  # noqa: E731
    report = gradguard.check_op(fn, x, checks=("gradient",))
    assert report.passed and report.options["probes"] == 1
    assert any(n.endswith("(probes=1) to bound memory and time; pass probes=3 for more") for n in report.notes)
    asked = gradguard.check_op(fn, x, checks=("gradient",), probes=2)
    assert asked.options["probes"] == 2 and not any("probes=1" in n for n in asked.notes)


def test_large_inputs_run_the_regimes_on_a_slice_of_the_batch():
    from gradguard.checks.audit import LARGE_INPUT_ELEMENTS

    rows = 2 * LARGE_INPUT_ELEMENTS // 64
    x = torch.randn(rows, 64, generator=_g(4))
    report = gradguard.check_op(lambda a: torch.sin(a) * a, x, regimes=["large_magnitude"])
    assert report.passed, str(report)
    assert f"the regimes run on the first {rows // 2} of {rows} rows (leading dimension)" in " ".join(report.notes)
    ran = {c.check: c.detail for c in report.checks if c.status == "pass"}
    assert ran["regime.batch_slice"] == f"first {rows // 2} of {rows} rows" and "regime.large_magnitude" in ran
    # a wrong backward on such inputs is still caught, on the given inputs (the full batch)
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return torch.sin(a) * a

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            return g * torch.sin(a)

    wrong = gradguard.check_op(Wrong.apply, x, regimes=["large_magnitude"])
    assert wrong.root_cause.check == "gradient.numerical" and wrong.root_cause.regime == "given"


class _SquaresUpstream(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * g * torch.cos(x)


def test_a_linearity_failure_is_shrunk_to_inputs_that_show_it():
    # the linearity probe used to run on the given inputs whatever the candidate, so a shrink never verified
    x = torch.randn(6, 5, dtype=torch.float64, generator=_g(5))
    report = gradguard.check_op(_SquaresUpstream.apply, x, checks=("gradient",))
    failure = next(f for f in report.failures if f.check == "gradient.cotangent_linearity")
    scope = {"torch": torch}
    exec(failure.repro.split("gradguard.check_op")[0], scope)  # the repro's input
    assert tuple(scope["x"].shape) == (1, 5)  # one row of the six, on which the failure still shows


class _SinMatmulTwiceX(torch.autograd.Function):
    """sin(x @ w) whose backward doubles x's gradient."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.sin(x @ w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        c = torch.cos(x @ w) * g
        return 2 * c @ w.T, x.T @ c


def test_finite_differences_that_do_not_settle_do_not_judge():
    """x1000, sin(x @ w) turns ~1e3 times per unit of x: central differences at h and h/2 disagree, so the
    large-magnitude regime says so instead of failing a correct op; a wrong backward is still caught where
    they settle."""
    x = torch.randn(4, 3, dtype=torch.float64, generator=_g(0))
    w = torch.randn(3, 5, dtype=torch.float64, generator=_g(1))
    report = gradguard.check_op(lambda a, b: torch.sin(a @ b), x, w)
    assert report.failures == []
    assert any(n.startswith("a: finite differences do not settle at this step") and "large_magnitude" in n
               for n in report.notes)
    wrong = gradguard.check_op(_SinMatmulTwiceX.apply, x, w)
    assert [(f.check, f.regime, f.input) for f in wrong.failures][:1] == [("gradient.numerical", "given", "x")]
