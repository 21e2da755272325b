"""Cells under test. In a source file on purpose: MindSpore graph mode parses source and cannot parse lambdas."""

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops


class XSinX(nn.Cell):
    def construct(self, x):
        return x * ops.sin(x)

    def bprop(self, x, out, dout):
        return (dout * (ops.sin(x) + x * ops.cos(x)),)


class MissingTerm(nn.Cell):
    def construct(self, x):
        return x * ops.sin(x)

    def bprop(self, x, out, dout):
        return (dout * ops.sin(x),)


class Float32Bprop(nn.Cell):
    def construct(self, x):
        return x * ops.sin(x)

    def bprop(self, x, out, dout):
        x32 = x.astype(ms.float32)
        return (dout.astype(ms.float32) * (ops.sin(x32) + x32 * ops.cos(x32)),)


class ExtraGrads(nn.Cell):
    def construct(self, x):
        return x * ops.sin(x)

    def bprop(self, x, out, dout):
        return (dout * (ops.sin(x) + x * ops.cos(x)), dout)


class ScaleWithBprop(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.array([2.0]), ms.float64), name="w")

    def construct(self, x):
        return x * self.w

    def bprop(self, x, out, dout):
        return (dout * self.w,)


class Flip(nn.Cell):
    def construct(self, x):
        return ops.flip(x, (1,))

    def bprop(self, x, out, dout):
        return (dout,)


def x_sin_x(x):
    """A plain function (no Cell, no bprop): MindSpore differentiates it; graph mode parses it from this file."""
    return x * ops.sin(x)


class WritesInput(nn.Cell):
    """Stores its result into its input with ops.assign: bytes change, Tensor._version does not."""

    def construct(self, x):
        out = ops.exp(x) * 1.0
        ops.assign(x, ops.zeros_like(x))
        return out


class AssumesContiguous(nn.Cell):
    """2 * x, read the way a C kernel that ignores strides reads it: numel float64 values from data_ptr()."""

    def construct(self, x):
        import ctypes

        n = int(np.prod(x.shape))
        raw = np.ctypeslib.as_array((ctypes.c_double * n).from_address(x.data_ptr())).copy()
        return Tensor(raw.reshape(x.shape) * 2.0, ms.float64)

    def bprop(self, x, out, dout):
        return (dout * 2.0,)


def gather_rows(x, idx, scale=1.0):
    """A function with an integer input and a keyword argument."""
    return ops.gather(x, idx, 0) * scale


class BareTensorBprop(nn.Cell):
    """Correct gradient, but bprop returns a tensor instead of a tuple."""

    def construct(self, x):
        return x * ops.sin(x)

    def bprop(self, x, out, dout):
        return dout * (ops.sin(x) + x * ops.cos(x))
