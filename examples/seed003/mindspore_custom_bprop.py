"""Seed 003 (MindSpore forum: custom op x*sin(x) with a bprop, "gradient does not match"), run under gradguard.
Run with .venv-mindspore/bin/python (MindSpore needs numpy<2).

The forum's verdict ("remove the bprop, replace the numerical gradient by the analytic formula") hid the real
problem: its numerical checker was wrong (float32 input, `ops.zeros_like` on a numpy array, ones as
cotangent). Below: a correct numerical checker (float64 central differences, random cotangent), and
gradguard's check_op on a correct and a wrong bprop, in PyNative and graph mode.
"""

import os
import tempfile

os.environ.setdefault("HOME", tempfile.mkdtemp())
os.chdir(tempfile.mkdtemp())  # a failed graph compile writes rank_0/om/analyze_fail.ir into the cwd

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402

from gradguard.backends.mindspore import check_op  # noqa: E402


class CustomOp(nn.Cell):
    def construct(self, x):
        return x * ops.sin(x)

    def bprop(self, x, out, dout):
        return (dout * (ops.sin(x) + x * ops.cos(x)),)


class CustomOpWrong(nn.Cell):
    def construct(self, x):
        return x * ops.sin(x)

    def bprop(self, x, out, dout):
        return (dout * ops.sin(x),)  # missing x*cos(x)


def numerical_gradient(f, x: np.ndarray, cotangent: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Correct replacement for the forum's checker: d/dx of <f(x), c> by float64 central differences."""
    x = x.astype(np.float64).copy()
    grad = np.zeros_like(x)
    for i in range(x.size):
        old = x.flat[i]
        x.flat[i] = old + eps
        plus = np.sum(f(ms.Tensor(x, ms.float64)).asnumpy() * cotangent)
        x.flat[i] = old - eps
        minus = np.sum(f(ms.Tensor(x, ms.float64)).asnumpy() * cotangent)
        x.flat[i] = old
        grad.flat[i] = (plus - minus) / (2 * eps)
    return grad


if __name__ == "__main__":
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.runtime.launch_blocking()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(10)
    c = rng.standard_normal(10)
    for cell in (CustomOp(), CustomOpWrong()):
        analytic = ms.grad(lambda t: (cell(t) * ms.Tensor(c, ms.float64)).sum())(ms.Tensor(x, ms.float64)).asnumpy()
        numeric = numerical_gradient(cell, x, c)
        print(f"{type(cell).__name__}: max |analytic - numeric| = {np.abs(analytic - numeric).max():.3e}")
    print()
    print(check_op(CustomOp(), x.reshape(2, 5)))
    print(check_op(CustomOpWrong(), x.reshape(2, 5)))
