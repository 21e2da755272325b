"""check_op on HIPS autograd: custom primitives with a hand-written vjp (seed 003's class of op) and plain autograd
functions, audited by the one engine (NOTE [autograd in the audit engine] in gradguard/backends/autograd/check.py).

autograd is pure Python on numpy and installed in the torch venv (requirements-dev.txt); a missing autograd fails
here, it is never skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys

import autograd.numpy as anp
import numpy as np
import pytest
from autograd import grad
from autograd.extend import defvjp, primitive

import gradguard
from gradguard import InvalidArgument

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conformance"))
from hazards import HAZARDS  # noqa: E402

RNG = np.random.default_rng(3)
X = RNG.standard_normal(6)
A = RNG.standard_normal((3, 4))
W = RNG.standard_normal((4, 4))
W_WIDE = RNG.standard_normal((4, 5))


def check(fn, *inputs, **options):
    return gradguard.check_op(fn, *inputs, backend="autograd", **options)


# -- primitives: one correct, each buggy one with a single mistake -----------------------------------------------
@primitive
def xsin(x):
    return x * np.sin(x)


defvjp(xsin, lambda ans, x: lambda g: g * (np.sin(x) + x * np.cos(x)))


@primitive
def xsin_product_rule_forgotten(x):
    return x * np.sin(x)


defvjp(xsin_product_rule_forgotten, lambda ans, x: lambda g: g * x * np.cos(x))


@primitive
def square(x):
    return x * x


defvjp(square, lambda ans, x: lambda g: g * x)  # the factor 2 is missing


@primitive
def shift(x, b):
    return x + x * x - b


defvjp(shift, lambda ans, x, b: lambda g: g * (1 + 2 * x), lambda ans, x, b: lambda g: g)  # b's sign is wrong


@primitive
def matmul(x, w):
    return x @ w


defvjp(matmul, lambda ans, x, w: lambda g: g @ w.T, lambda ans, x, w: lambda g: x.T @ g)


@primitive
def matmul_transposed_grad(x, w):
    return x @ w


defvjp(matmul_transposed_grad, lambda ans, x, w: lambda g: g @ w.T, lambda ans, x, w: lambda g: (x.T @ g).T)


@primitive
def doubles_its_input(x):
    x *= 2.0  # a "kernel" that works in place: the array autograd's other vjps closed over changes
    return x + 0.0


defvjp(doubles_its_input, lambda ans, x: lambda g: 2.0 * g)


@primitive
def scales_the_upstream_gradient(x):
    return 3.0 * x


def _in_place_vjp(ans, x):
    def vjp(g):
        g *= 3.0
        return g

    return vjp


defvjp(scales_the_upstream_gradient, _in_place_vjp)


# -- a correct op passes -----------------------------------------------------------------------------------------
def test_a_correct_primitive_passes_with_the_primitives_own_names():
    report = check(xsin, X)
    assert report.passed, report
    assert report.op == "xsin" and report.inputs == ["x: float64[6] (differentiated)"]
    assert report.backend.startswith("autograd ")
    assert {"gradient.numerical", "mutation.silent_input_write", "composition.exp", "regime.noncontiguous"} <= {
        c.check for c in report.checks if c.status == "pass"}
    skipped = {c.check: c.detail for c in report.checks if c.status == "skip"}
    assert "autograd has no view tracking" in skipped["aliasing"]
    assert "channels_last" in skipped["regime.channels_last"]
    # the primitive wrapper's own keyword is not an argument of the op (no flags regime varies it)
    assert "called_by_autograd_dispatcher" not in str(report)


def test_a_correct_two_input_primitive_passes_in_float32_too():
    assert check(matmul, A, W_WIDE).passed
    report = check(matmul, A.astype(np.float32), W_WIDE.astype(np.float32), checks=("gradient",))
    assert report.passed, report


def test_a_plain_autograd_function_passes():
    def layer(x, w, temperature=2.0):
        return anp.tanh(anp.dot(x, w) / temperature), anp.sum(x ** 2)

    report = check(layer, A, W_WIDE)
    assert report.passed, report
    assert report.inputs == ["x: float64[3, 4] (differentiated)", "w: float64[4, 5] (differentiated)"]


def test_a_plain_function_using_a_correct_primitive_passes():
    assert check(lambda x, w: anp.sum(anp.tanh(matmul(x, w))), A, W).passed


def test_a_reference_is_used():
    report = check(xsin, X, reference=lambda x: x * anp.sin(x))
    assert report.passed and report.reference.endswith("<lambda>")
    assert "forward.reference" in {c.check for c in report.checks if c.status == "pass"}


# -- a wrong vjp is caught, naming the input -------------------------------------------------------------------
@pytest.mark.parametrize("fn, inputs, wrong", [
    (xsin_product_rule_forgotten, (X,), "x"),
    (square, (X,), "x"),
    (shift, (X, X[::-1].copy()), "b"),
    (matmul_transposed_grad, (A, W), "w"),
], ids=["product_rule", "factor_2", "sign", "transposed_square"])
def test_a_wrong_vjp_is_caught_and_the_report_names_the_input(fn, inputs, wrong):
    report = check(fn, *inputs)
    assert not report.passed
    root = report.root_cause
    assert (root.check, root.regime, root.input) == ("gradient.numerical", "given", wrong), report
    assert root.where.startswith(f"{wrong}[")
    assert root.repro.splitlines()[-1].endswith(", backend='autograd')")  # numpy inputs name no framework


def test_a_transposed_gradient_of_another_shape_is_named_not_a_broadcast_error():
    report = check(matmul_transposed_grad, A, W_WIDE)
    root = report.root_cause
    assert (root.check, root.input, root.where) == ("op.raised", "w", None)
    assert root.message == (
        "fn's backward raised ValueError: the gradient arriving at input w has shape [5, 4] but w has shape [4, 5]: "
        "a hand-written vjp returned a transposed, unreduced or otherwise misshapen gradient (autograd does not "
        "check gradient shapes) (inputs: float64)")
    assert root.fix.startswith("make the vjp for w return an array of w's shape")


def test_a_primitive_writing_into_its_input_is_a_silent_write():
    report = check(doubles_its_input, A)
    root = report.root_cause
    assert (root.check, root.input) == ("mutation.silent_input_write", "x")
    assert root.message == "the op's forward changed the bytes of input x (float64[3, 4]) (numpy arrays have no version counter)"
    assert "autograd cannot see this write" in root.why
    # exp's and relu's vjps read the output they saved, which the op overwrote
    assert {"composition.exp", "composition.relu"} <= report.failed_checks()
    assert all("make_vjp" in f.repro for f in report.failures if f.check.startswith("composition."))


def test_a_vjp_writing_into_the_upstream_gradient_is_caught():
    report = check(scales_the_upstream_gradient, X)
    assert report.failed_checks() == {"mutation.grad_output_write"}, report
    assert "g * x instead of g *= x" in report.root_cause.fix


def test_a_vjp_that_changes_state_between_calls_is_not_repeatable():
    calls = []

    @primitive
    def counting(x):
        return 2.0 * x

    defvjp(counting, lambda ans, x: lambda g: calls.append(1) or 2.0 * g * len(calls) ** 0.5)
    report = check(counting, X, checks=("mutation",))
    assert "mutation.backward_not_repeatable" in report.failed_checks(), report
    (finding,) = [f for f in report.failures if f.check == "mutation.backward_not_repeatable"]
    assert "(a second call of the same autograd vjp)" in finding.message


# -- bad input: a clear error naming the argument ----------------------------------------------------------------
def test_a_torch_tensor_is_refused_naming_the_argument():
    torch = pytest.importorskip("torch")  # the torch venv has it; the point is the message, not torch
    with pytest.raises(InvalidArgument) as info:
        check(matmul, A, torch.ones(4, 4))
    assert str(info.value) == (
        "check_op: input w is a torch.Tensor, but backend='autograd' differentiates numpy arrays; pass a numpy "
        "array (w.detach().numpy()) or check the op with backend='torch'.")


def test_a_list_instead_of_an_array_is_refused_naming_the_argument():
    with pytest.raises(InvalidArgument) as info:
        check(xsin, [0.1, 0.2])
    assert str(info.value) == (
        "check_op: no input is a floating-point numpy array (got x: list), so there is nothing for autograd to "
        "differentiate; pass the differentiated inputs as float arrays, e.g. np.asarray(x, dtype=np.float64) (a "
        "Python list or float is passed to fn unchanged, as an argument).")


def test_a_non_numeric_array_is_refused_naming_the_argument():
    with pytest.raises(InvalidArgument, match=r"^check_op: input w is a numpy array of dtype <U1, which autograd "):
        check(matmul, A, np.array(["a"]))


def test_a_function_that_leaves_autograd_says_so():
    from autograd.tracer import getval

    with pytest.raises(InvalidArgument, match=r"fn returned no differentiable tensor output .* plain numpy"):
        check(lambda x: np.sin(getval(x)), X)


def test_an_unknown_option_names_the_known_ones():
    with pytest.raises(InvalidArgument, match=r"unknown option 'wrtt'"):
        check(xsin, X, wrtt=0)


# -- choosing the framework --------------------------------------------------------------------------------------
def test_guard_is_not_a_capability_and_says_so_like_the_resolver():
    from gradguard.backends import KNOWN, choose

    assert KNOWN["autograd"].capabilities == frozenset({"check_op"})
    with pytest.raises(InvalidArgument) as info:
        with gradguard.guard(backend="autograd"):
            pass
    assert str(info.value) == ("guard(..., backend='autograd'): supported by the torch and paddle and mindspore "
                               "backends, not autograd")
    with pytest.raises(InvalidArgument, match="^guard\\(\\.\\.\\., backend='autograd'\\)"):
        choose("autograd", needs="guard")


def test_auto_picks_autograd_when_it_is_the_one_framework_imported():
    # a fresh process: numpy arrays name no framework, so "auto" goes by what is imported; guard() there refuses
    # with the resolver's words, as for backend="autograd"
    code = ("import numpy as np, autograd.numpy as anp, gradguard\n"
            "r = gradguard.check_op(lambda x: anp.sin(x), np.linspace(-1, 1, 5), checks=('gradient',))\n"
            "import sys\nprint(r.backend.split()[0], r.passed, 'torch' in sys.modules)\n"
            "try:\n    gradguard.guard().__enter__()\nexcept TypeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "autograd True False",
        "guard(..., backend='autograd'): supported by the torch and paddle and mindspore backends, not autograd"]


def test_gradguard_run_guards_a_script_that_imports_autograd_before_torch(tmp_path):
    """`gradguard run` enters the guard at the first import of a framework that has one: autograd has none."""
    script = tmp_path / "both.py"
    script.write_text("import autograd.numpy\nimport torch\n"
                      "x = torch.ones(3, requires_grad=True)\ny = x.sin()\nx.data.mul_(2)\ny.sum().backward()\n")
    out = subprocess.run([sys.executable, "-m", "gradguard", "run", str(script)], capture_output=True, text=True)
    assert "could not start" not in out.stderr
    assert "SilentModificationError" in out.stderr or "InplaceModificationError" in out.stderr, out.stderr[-2000:]


# -- the autograd column of the hazard table (tests/conformance/hazards.py): parity ------------------------------
def _augmented_assign(x):
    y = x * 1
    z = anp.sin(y)
    y += 1
    return anp.sum(z * y)


def _inplace_activation(x):
    s = anp.exp(x)
    anp.tanh(s, out=s)
    return anp.sum(s * 2)


@primitive
def _writes_first(y):
    y[0] = 5.0  # what `y.detach().numpy()[0] = 5.0` is in the torch column: a write autograd cannot see
    return 0.0 * y


defvjp(_writes_first, lambda ans, y: lambda g: 0.0 * g)


def _direct_memory_write(x):
    y = x * 1
    z = anp.sin(y)  # sin's vjp closes over y
    return anp.sum(z) + anp.sum(_writes_first(y))


SPELLINGS = {"augmented_assign": _augmented_assign, "inplace_activation": _inplace_activation,
             "direct_memory_write": _direct_memory_write}


def test_every_hazard_has_an_autograd_column_without_a_finding():
    assert all(spec["autograd"]["finding"] is None and spec["autograd"]["why"] for spec in HAZARDS.values())
    unwritten = set(HAZARDS) - set(SPELLINGS)
    assert unwritten == {"optimizer_update"}
    assert HAZARDS["optimizer_update"]["autograd"]["why"].startswith("cannot be written")


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_the_hazard_in_autograd_does_what_its_column_says(name):
    spec = HAZARDS[name]["autograd"]
    x = np.array([0.1, 0.2, 0.3])
    try:
        g = grad(SPELLINGS[name])(x)
    except Exception as error:  # noqa: BLE001 - parity: which error autograd itself raises
        assert type(error).__name__ == spec["framework_raises"]
        return
    assert spec["framework_raises"] is None
    right = {"augmented_assign": np.cos(x) * (x + 1) + np.sin(x), "direct_memory_write": np.cos(x)}[name]
    if name == "direct_memory_write":  # silently wrong: sin's vjp read the overwritten y[0]
        np.testing.assert_allclose(g, np.cos([5.0, *x[1:]]))
        assert not np.allclose(g, right)
        report = check(_writes_first, x)
        assert spec["check_op"] in report.failed_checks()
    else:
        np.testing.assert_allclose(g, right)
