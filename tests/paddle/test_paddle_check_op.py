"""check_op on Paddle: PyLayer and plain functions through the one audit engine; seed 001/notes cases."""

import numpy as np
import paddle
import pytest

from gradguard.backends.paddle import check_op

X = np.random.default_rng(0).standard_normal((3, 4))


def _layer(backward_fn):
    class L(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return a * paddle.sin(a)

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensor()
            return backward_fn(a, g)

    return L


def test_correct_pylayer_passes():
    r = check_op(_layer(lambda a, g: g * (paddle.sin(a) + a * paddle.cos(a))), X)
    assert r.passed, str(r)
    assert r.backend == f"paddle {paddle.__version__}" and r.op == "L.apply"
    ran = {c.check for c in r.checks if c.status == "pass"}
    assert {"gradient.numerical", "gradient.cotangent_linearity", "mutation.saved_tensor_modified",
            "mutation.silent_input_write", "composition.exp", "regime.kinks"} <= ran
    skipped = {c.check: c.detail for c in r.checks if c.status == "skip"}
    assert skipped["aliasing"].startswith("not checked on Paddle: a Paddle tensor does not say whether autograd")


def test_correct_op_has_no_false_alarm_in_float32_and_float64():
    good = _layer(lambda a, g: g * (paddle.sin(a) + a * paddle.cos(a)))
    for dtype in ("float32", "float64"):
        r = check_op(good, paddle.to_tensor(X).astype(dtype))
        assert r.passed and not r.warnings, (dtype, str(r))


def test_missing_term_fails_gradient_check_naming_element():
    r = check_op(_layer(lambda a, g: g * paddle.sin(a)), X)
    assert r.root_cause.check == "gradient.numerical"
    assert r.root_cause.message == "backward of a disagrees with central differences (full Jacobian)"
    assert r.root_cause.where.startswith("a[0, ")
    assert "paddle.to_tensor([[" in r.root_cause.repro  # shrunk to one row, rebuilt exactly


def test_flip_without_flipped_backward_needs_random_cotangent():
    class Flip(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, a):
            return paddle.flip(a, axis=[1])

        @staticmethod
        def backward(ctx, g):
            return g  # forgot to flip back

    r = check_op(Flip, X)
    assert r.root_cause.check == "gradient.numerical"


def test_float32_backward_fails_precision():
    r = check_op(_layer(lambda a, g: (g.astype("float32") * (paddle.sin(a.astype("float32"))
                                                               + a.astype("float32") * paddle.cos(a.astype("float32")))
                                      ).astype("float64")), X)
    assert r.root_cause.check == "gradient.precision"
    assert r.root_cause.message.startswith("the float64 gradient of a is only float32-accurate")


def test_pylayer_that_mutates_saved_tensor():
    class Bad(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, a):
            b = a * 1
            ctx.save_for_backward(b)
            out = paddle.sin(b)
            b.set_value(paddle.zeros_like(b))
            return out

        @staticmethod
        def backward(ctx, g):
            (b,) = ctx.saved_tensor()
            return g * paddle.cos(b)

    r = check_op(Bad, X)
    f = next(f for f in r.failures if f.check == "mutation.saved_tensor_modified")
    assert f.message == ("saved tensor #0 (float64[3, 4]) changed between the forward that saved it and the backward "
                         "that read it (its values changed without a version bump: version 0 -> 0)")
    assert "gradient.numerical" in r.failed_checks()  # and the gradient it computes is wrong


def test_builtin_function_three_inputs_passes():
    r = check_op(lambda x, w, b: paddle.tanh(x @ w + b), X, np.ones((4, 2)) * 0.3, np.zeros(2))
    assert r.passed, str(r)
    assert r.inputs == ["x: float64[3, 4] (differentiated)", "w: float64[4, 2] (differentiated)",
                        "b: float64[2] (differentiated)"]


def test_float32_forward_on_float64_inputs_is_said():
    r = check_op(lambda x: x.astype("float32") * 2, X)
    assert "fn returned float32 outputs for float64 inputs; float64 checks skipped" in r.notes


def test_scalars_pass_through_like_gradcheck():
    r = check_op(lambda x, t: x / t, paddle.to_tensor(X), 2.0)
    assert r.passed, str(r)
    assert r.inputs[1] == "t: float 2.0"


def test_dispatch_through_registry():
    from gradguard.backends import get_adapter, resolve_backend

    assert resolve_backend("auto", [paddle.ones([1])]) == "paddle"
    adapter = get_adapter("paddle")
    x = adapter.from_numpy(X)
    (g,) = adapter.vjp(lambda a: a * a, [x], [np.ones_like(X)])
    np.testing.assert_allclose(g, 2 * X)
    assert adapter.version(x) == 0 and adapter.mode() == "eager"
    with pytest.raises(TypeError):
        resolve_backend("jax")


def test_public_check_op_dispatches_to_paddle():
    import gradguard

    r = gradguard.check_op(lambda x: x * paddle.sin(x), X, backend="paddle")
    assert r.passed and r.backend.startswith("paddle")
    r = gradguard.check_op(lambda x: x * paddle.sin(x), paddle.to_tensor(X))  # auto: paddle tensor input
    assert r.passed and r.backend.startswith("paddle")


def test_reference_is_honoured_and_torch_options_work():
    import gradguard
    from gradguard import InvalidArgument

    op = lambda x: x * paddle.sin(x)  # noqa: E731
    good = check_op(op, X, reference=lambda x: x * paddle.sin(x))
    assert good.passed and {"forward.reference", "gradient.reference"} <= {c.check for c in good.checks}
    # a reference 100x off must fail (it used to be dropped silently)
    bad = gradguard.check_op(op, paddle.to_tensor(X), reference=lambda x: 100 * x * paddle.sin(x))
    assert bad.root_cause.check == "forward.reference"
    # the torch options are the Paddle options: one engine
    only = gradguard.check_op(op, paddle.to_tensor(X), regimes=["kinks"], checks=("gradient", "regime"))
    assert only.passed and {c.check for c in only.checks if c.check.startswith("regime.")} == {"regime.kinks"}
    with pytest.raises(InvalidArgument) as e:
        gradguard.check_op(op, paddle.to_tensor(X), regime=["kinks"])
    assert str(e.value).startswith("check_op: unknown option 'regime'; known options: ")


def _writes_input(x):
    y = x * 2
    with paddle.no_grad():
        x.set_value(paddle.zeros_like(x))  # set_value does not bump inplace_version
    return y


def test_silent_input_write_is_said_in_paddle_terms():
    r = check_op(_writes_input, X, checks=("gradient", "mutation"))
    f = next(f for f in r.failures if f.check == "mutation.silent_input_write")
    assert f.message == "the op's forward changed the bytes of input x (float64[3, 4]) without bumping its version (0)"
    assert f.why.startswith("Paddle's autograd cannot see this write (set_value, copy_")
    assert "torch" not in f.why + f.fix


def _only_with_autograd(x):
    if x.stop_gradient:
        raise RuntimeError("this op needs autograd on")
    return x * paddle.sin(x)


def test_an_op_that_only_runs_with_autograd_is_said_in_paddle_terms():
    r = check_op(_only_with_autograd, X)
    assert r.root_cause.check == "op.raised"
    assert r.root_cause.message.startswith("fn's forward under paddle.no_grad() raised RuntimeError: this op needs")
    assert r.root_cause.why.startswith("the op runs with autograd on but crashes with it off")
