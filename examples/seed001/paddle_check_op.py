"""Seed 001 follow-up: audit a Paddle custom op (PyLayer) with gradguard's check_op. Run with .venv-paddle/bin/python."""

import os
import tempfile

os.environ.setdefault("HOME", tempfile.mkdtemp())
import numpy as np  # noqa: E402
import paddle  # noqa: E402

from gradguard.backends.paddle import check_op  # noqa: E402


class XSinX(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * paddle.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensor()
        return g * (paddle.sin(x) + x * paddle.cos(x))


class XSinXWrong(XSinX):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensor()
        return g * paddle.sin(x)  # forgot x*cos(x)


if __name__ == "__main__":
    x = np.random.default_rng(0).standard_normal((3, 4))
    print(check_op(XSinX, x))
    print(check_op(XSinXWrong, x))
