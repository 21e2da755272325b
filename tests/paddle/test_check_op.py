"""check_op on Paddle: PyLayer and plain functions; seed 001/notes cases."""

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
    assert r.max_abs_err < 1e-8
    assert r.backend.startswith("paddle 3.") and r.modes == ["eager (dygraph)"]
    assert {"gradient", "precision", "saved_tensor_modified"} <= set(r.checks)


def test_missing_term_fails_gradient_check_naming_element():
    r = check_op(_layer(lambda a, g: g * paddle.sin(a)), X)
    assert r.failed_checks == ["gradient"]
    worst = r.failures[0].details["worst"]
    assert worst["input"] == 0 and len(worst["index"]) == 2


def test_flip_without_flipped_backward_needs_random_cotangent():
    class Flip(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, a):
            return paddle.flip(a, axis=[1])

        @staticmethod
        def backward(ctx, g):
            return g  # forgot to flip back

    r = check_op(Flip, X)
    assert r.failed_checks == ["gradient"]


def test_float32_backward_fails_precision():
    r = check_op(_layer(lambda a, g: (g.astype("float32") * (paddle.sin(a.astype("float32"))
                                                               + a.astype("float32") * paddle.cos(a.astype("float32")))
                                      ).astype("float64")), X)
    assert r.failed_checks == ["precision"]


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
    assert "saved_tensor_modified" in r.failed_checks
    assert "values changed without a version bump" in r.failures[0].message


def test_builtin_function_three_inputs_passes():
    r = check_op(lambda x, w, b: paddle.tanh(x @ w + b), X, np.ones((4, 2)) * 0.3, np.zeros(2))
    assert r.passed, str(r)


def test_float32_forward_is_reported():
    r = check_op(lambda x: x.astype("float32") * 2, X)
    assert r.failed_checks == ["forward_dtype"]
    assert r.failures[0].message == "for float64 inputs the op returned float32; a float64 reference gradient cannot be formed"


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


def test_reference_is_honoured_and_torch_options_are_named():
    import gradguard
    from gradguard import InvalidArgument

    op = lambda x: x * paddle.sin(x)  # noqa: E731
    good = check_op(op, X, reference=lambda x: x * paddle.sin(x))
    assert good.passed and {"forward.reference", "gradient.reference"} <= set(good.checks)
    # a reference 100x off must fail (it used to be dropped silently)
    bad = gradguard.check_op(op, paddle.to_tensor(X), reference=lambda x: 100 * x * paddle.sin(x))
    assert bad.failed_checks == ["forward.reference"]
    with pytest.raises(InvalidArgument) as e:
        gradguard.check_op(op, paddle.to_tensor(X), regimes=["kinks"])
    assert str(e.value).startswith("check_op: option 'regimes' is not supported by the Paddle check_op yet")
