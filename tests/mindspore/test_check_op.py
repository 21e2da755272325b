"""check_op on MindSpore Cells with a custom bprop: each pitfall of issue #5, in PyNative and graph mode."""

import numpy as np
import mindspore as ms
import pytest

from gradguard.backends.mindspore import check_op

from cells import ExtraGrads, Flip, Float32Bprop, MissingTerm, ScaleWithBprop, XSinX

X = np.random.default_rng(0).standard_normal((3, 4))


def test_correct_bprop_passes_in_both_modes():
    r = check_op(XSinX(), X)
    assert r.passed, str(r)
    assert r.modes == ["pynative", "graph"] and "graph_mode" in r.checks
    assert r.backend.startswith("mindspore 2.10") and "CPU" in r.backend
    assert r.max_abs_err < 1e-8
    assert ms.get_context("mode") == ms.PYNATIVE_MODE


def test_wrong_bprop_fails_in_pynative_and_graph():
    r = check_op(MissingTerm(), X)
    assert r.failed_checks == ["gradient", "graph_mode"]
    assert [f.details["mode"] for f in r.failures] == ["pynative", "graph"]
    assert "analytic and numerical gradients differ" in r.failures[0].message


def test_float32_bprop_silently_cast_is_caught():
    r = check_op(Float32Bprop(), X)
    assert r.failed_checks[0] == "bprop_dtype"
    assert r.failures[0].message == ("bprop returned Float32 for input 0 of dtype Float64; MindSpore silently casts it "
                                     "to Float64, so the result's dtype hides the lower-precision computation")
    # and the numerical side sees it too, below the usual tolerance: the precision check
    assert "precision" in r.failed_checks


def test_extra_gradients_are_reported():
    r = check_op(ExtraGrads(), X)
    assert r.failed_checks == ["bprop_extra_gradients"]
    assert r.failures[0].details == {"returned": 2, "inputs": 1, "mode": "pynative"}


def test_missing_weight_gradient_is_reported():
    r = check_op(ScaleWithBprop(), X)
    assert "missing_weight_gradient" in r.failed_checks
    f = next(f for f in r.failures if f.check == "missing_weight_gradient")
    assert "is all zeros, but the output depends on it" in f.message
    # graph mode refuses Parameters in a bprop outright
    g = next(f for f in r.failures if f.check == "graph_mode")
    assert "does not support using Parameter" in g.message


def test_flip_not_flipped_back_needs_random_cotangent():
    r = check_op(Flip(), X)
    assert "gradient" in r.failed_checks


def test_pynative_only():
    r = check_op(XSinX(), X, modes=("pynative",))
    assert r.passed and r.modes == ["pynative"] and "graph_mode" not in r.checks


def test_public_check_op_dispatches_to_mindspore():
    import gradguard

    r = gradguard.check_op(MissingTerm(), X, backend="mindspore")
    assert r.backend.startswith("mindspore") and r.failed_checks == ["gradient", "graph_mode"]


def test_reference_is_honoured_and_torch_options_are_named():
    import gradguard
    from gradguard import InvalidArgument

    good = check_op(XSinX(), X, modes=("pynative",), reference=lambda x: x * ms.ops.sin(x))
    assert good.passed, str(good)
    assert {"forward.reference", "gradient.reference"} <= set(good.checks)
    bad = gradguard.check_op(XSinX(), ms.Tensor(X), modes=("pynative",), reference=lambda x: 100 * x * ms.ops.sin(x))
    assert bad.failed_checks == ["forward.reference"]
    wrong = check_op(MissingTerm(), X, modes=("pynative",), reference=lambda x: x * ms.ops.sin(x))
    assert "gradient.reference" in wrong.failed_checks
    with pytest.raises(InvalidArgument) as e:
        gradguard.check_op(XSinX(), ms.Tensor(X), kwargs={})
    assert str(e.value).startswith("check_op: option 'kwargs' is not supported by the MindSpore check_op yet")
