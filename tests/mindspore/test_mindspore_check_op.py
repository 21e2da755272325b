"""check_op on MindSpore Cells with a custom bprop: the one audit engine with MindSpore's adapter, each pitfall
of issue #5, in PyNative and graph mode."""

import numpy as np
import mindspore as ms
import pytest

from gradguard import InvalidArgument
from gradguard.backends.mindspore import check_op

from cells import ExtraGrads, Flip, Float32Bprop, MissingTerm, ScaleWithBprop, WritesInput, XSinX, x_sin_x

X = np.random.default_rng(0).standard_normal((3, 4))


def _failure(report, check):
    return next(f for f in report.failures if f.check == check)


def test_correct_bprop_passes_in_both_modes():
    r = check_op(XSinX(), X)
    assert r.passed, str(r)
    assert r.failed_checks() == set()
    ran = {c.check: c.status for c in r.checks}
    assert ran["gradient.numerical"] == "pass" and ran["mode.graph"] == "pass"
    assert {ran[c] for c in ("bprop.return_type", "bprop.extra_gradients", "bprop.missing_gradients", "bprop.dtype")} == {"pass"}
    assert r.backend.startswith("mindspore 2.10") and "CPU" in r.backend
    assert r.inputs == ["x: float64[3, 4] (differentiated)"]
    assert ms.get_context("mode") == ms.PYNATIVE_MODE


@pytest.mark.parametrize("dtype", [ms.float32, ms.float64])
def test_correct_op_has_no_false_alarm_in_float32_or_float64(dtype):
    r = check_op(XSinX(), ms.Tensor(X, dtype))
    assert r.passed and r.findings == [], str(r)
    assert r.inputs == [f"x: {str(dtype).lower()}[3, 4] (differentiated)"]


def test_plain_function_passes_in_both_modes():
    r = check_op(x_sin_x, X)
    assert r.passed and r.findings == [], str(r)
    assert r.op == "x_sin_x" and r.inputs == ["x: float64[3, 4] (differentiated)"]
    statuses = {c.check: c.status for c in r.checks}
    assert statuses["mode.graph"] == "pass" and statuses["gradient.numerical"] == "pass"
    assert "bprop.dtype" not in statuses and "weights.gradient" not in statuses  # no bprop, no Parameters


def test_wrong_bprop_fails_in_pynative_and_graph():
    r = check_op(MissingTerm(), X)
    assert r.failed_checks() == {"gradient.numerical", "mode.graph"}
    assert [f.check for f in r.failures] == ["gradient.numerical", "mode.graph"]  # root cause first
    assert r.failures[0].message.startswith("backward of x disagrees with central differences")
    assert "equals PyNative's, which fails the gradient check above" in r.failures[1].message


def test_float32_bprop_silently_cast_is_caught():
    r = check_op(Float32Bprop(), X)
    assert {"bprop.dtype", "gradient.precision"} <= r.failed_checks()
    f = _failure(r, "bprop.dtype")
    assert f.message == ("bprop returned Float32 for x of dtype Float64; MindSpore silently casts it to "
                         "Float64, so the result's dtype hides the lower-precision computation")
    assert f.why and f.fix
    assert "only float32-accurate" in _failure(r, "gradient.precision").message


def test_extra_gradients_are_reported():
    r = check_op(ExtraGrads(), X)
    assert r.failed_checks() == {"bprop.extra_gradients"}
    assert r.failures[0].message == ("ExtraGrads.bprop returned 2 gradients for 1 input(s); MindSpore silently "
                                     "ignores the extra 1")


def test_missing_weight_gradient_is_reported():
    r = check_op(ScaleWithBprop(), X)
    assert r.failed_checks() == {"weights.missing_gradient", "mode.graph"}
    f = _failure(r, "weights.missing_gradient")
    assert "is all zeros, but the output depends on it" in f.message and f.input == "inner.w"
    assert "custom bprop" in f.why
    # graph mode refuses Parameters in a bprop outright
    assert "does not support using Parameter" in _failure(r, "mode.graph").message


def test_flip_not_flipped_back_needs_random_cotangent():
    r = check_op(Flip(), X)
    assert "gradient.numerical" in r.failed_checks()
    assert r.failures[0].check == "gradient.numerical"


def test_pynative_only_skips_graph_mode():
    r = check_op(XSinX(), X, modes=("pynative",))
    assert r.passed
    graph = [c for c in r.checks if c.check == "mode.graph"]
    assert [(c.status, c.detail) for c in graph] == [("skip", "modes=('pynative',)")]
    wrong = check_op(MissingTerm(), X, modes=("pynative",))
    assert wrong.failed_checks() == {"gradient.numerical"}


def test_users_context_mode_is_restored():
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        r = check_op(MissingTerm(), X)
        assert ms.get_context("mode") == ms.GRAPH_MODE
        assert "gradient.numerical" in r.failed_checks()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    with pytest.raises(InvalidArgument) as info:
        check_op(XSinX(), X, modes=("graph",))
    assert str(info.value) == ("check_op: modes must contain 'pynative' (the audit runs there) and may add 'graph'; "
                               "got ['graph']. Use modes=('pynative',) or modes=('pynative', 'graph').")
    assert ms.get_context("mode") == ms.PYNATIVE_MODE


def test_public_check_op_dispatches_to_mindspore():
    import gradguard

    r = gradguard.check_op(MissingTerm(), X, backend="mindspore")
    assert r.backend.startswith("mindspore") and r.failed_checks() == {"gradient.numerical", "mode.graph"}


def test_reference_is_honoured():
    import gradguard

    good = check_op(XSinX(), X, modes=("pynative",), reference=lambda x: x * ms.ops.sin(x))
    assert good.passed, str(good)
    statuses = {c.check: c.status for c in good.checks if c.regime == "given"}
    assert statuses["forward.reference"] == "pass" and statuses["gradient.reference"] == "pass"
    bad = gradguard.check_op(XSinX(), ms.Tensor(X), modes=("pynative",), reference=lambda x: 100 * x * ms.ops.sin(x))
    assert bad.failures[0].check == "forward.reference"
    assert bad.failures[0].message == "output differs from the reference's"
    wrong = check_op(MissingTerm(), X, modes=("pynative",), reference=lambda x: x * ms.ops.sin(x))
    assert {"gradient.numerical", "gradient.reference"} <= wrong.failed_checks()


def test_input_written_without_version_bump_is_reported_in_mindspore_terms():
    r = check_op(WritesInput(), X, modes=("pynative",), regimes=())
    f = _failure(r, "mutation.silent_input_write")
    assert f.message.startswith("the op's forward changed the bytes of input x")
    assert "ops.assign" in f.why and "PyTorch" not in f.why and "Tensor.copy_" in f.fix
    c = _failure(r, "composition.exp")
    assert "wrote into exp's output" in c.message and "ms.vjp(ops.exp, a)" in c.repro


def test_options_are_the_engines_plus_modes():
    with pytest.raises(InvalidArgument) as e:
        check_op(XSinX(), X, eps=1e-3)
    assert str(e.value).startswith("check_op: unknown option 'eps'; known options:") and "modes" in str(e.value)
    r = check_op(x_sin_x, X, modes=("pynative",), checks=("gradient",), probes=2)
    assert r.passed and {c.check.split(".")[0] for c in r.checks} == {"gradient", "mode"}  # no bprop, no Parameters


def test_kernel_that_ignores_strides_fails_the_noncontiguous_regime():
    from cells import AssumesContiguous

    r = check_op(AssumesContiguous(), X, modes=("pynative",), checks=("gradient", "regime"), regimes=("noncontiguous",))
    assert r.failed_checks() == {"regime.noncontiguous"}, str(r)
    assert "changes when the inputs are laid out differently" in r.failures[0].message
    ok = check_op(XSinX(), X, modes=("pynative",), checks=("regime",), regimes=("noncontiguous", "channels_last"))
    statuses = {c.check: (c.status, c.detail) for c in ok.checks}
    assert statuses["regime.noncontiguous"][0] == "pass"
    assert statuses["regime.channels_last"] == ("skip", "not run on MindSpore: MindSpore tensors carry no channels_last memory format")


def test_float32_bprop_on_float32_inputs_keeps_the_dtype_contract():
    r = check_op(Float32Bprop(), ms.Tensor(X, ms.float32), modes=("pynative",))
    assert [(c.status, c.regime) for c in r.checks if c.check == "bprop.dtype"] == [("pass", "given")]
    assert "bprop.dtype" not in r.failed_checks()


def test_integer_inputs_pass_through_and_kwargs_reach_the_op():
    from cells import gather_rows

    idx = ms.Tensor(np.array([0, 2, 2]), ms.int32)
    r = check_op(gather_rows, X, idx, kwargs={"scale": 3.0}, modes=("pynative",))
    assert r.passed, str(r)
    assert r.inputs == ["x: float64[3, 4] (differentiated)", "idx: int32[3]"]
    assert {c.check: c.status for c in r.checks}["regime.repeated_indices"] == "pass"
    graph = check_op(gather_rows, X, idx, kwargs={"scale": 3.0})
    assert [(c.status, c.detail) for c in graph.checks if c.check == "mode.graph"] == [("skip", "kwargs are not passed in graph mode")]


def test_bprop_returning_a_bare_tensor_is_reported():
    from cells import BareTensorBprop

    r = check_op(BareTensorBprop(), X, modes=("pynative",))
    assert "bprop.return_type" in r.failed_checks(), str(r)
    f = _failure(r, "bprop.return_type")
    assert f.message == "BareTensorBprop.bprop returned Tensor, not a tuple of 1 gradient(s)"
    assert f.fix.endswith("return (dx,)")
